"""Which process groups of a layout cross nodes, by rank arithmetic (no process group).

Ranks sit on nodes in blocks of ``ranks_per_node`` (torchrun numbers each node's workers
consecutively). The groups themselves are checked against the live meshes of ``ParallelState`` in
``test_parallel_state.py::test_meshes_and_groups_at_world_4``.
"""

from __future__ import annotations

import pytest
from mm_parallel import NodeLayout, ParallelState, describe_node_layout, node_crossings, sub_plan_rank_groups


def crossings(world: int, per_node: int, **degrees: int) -> dict[str, int]:
    state = ParallelState(world_size=world, device_type="cpu", **degrees)
    return node_crossings(state.rank_groups(), NodeLayout(world, per_node))


def test_two_nodes_of_four_with_ulysses_2_keep_cp_and_shard_groups_inside_a_node():
    spans = crossings(8, 4, dp_replicate=2, ulysses=2)
    assert spans["ulysses"] == spans["cp"] == spans["shard"] == 1
    assert spans["replicate"] == 2  # only the HSDP gradient all-reduce crosses nodes


def test_the_groups_are_the_blocks_and_strides_of_the_mesh():
    groups = ParallelState(world_size=8, dp_replicate=2, ulysses=2, device_type="cpu").rank_groups()
    assert groups["ulysses"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert groups["shard"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert groups["replicate"] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert groups["dp"] == [[0, 2, 4, 6], [1, 3, 5, 7]]


def test_plain_fsdp_over_two_nodes_shards_across_them():
    assert crossings(8, 4, ulysses=2)["shard"] == 2


def test_a_cp_group_larger_than_a_node_crosses_nodes():
    spans = crossings(8, 2, ulysses=4, dp_replicate=2)
    assert spans["ulysses"] == 2 and spans["shard"] == 2 and spans["replicate"] == 2


def test_the_description_says_which_groups_cross_nodes():
    state = ParallelState(world_size=8, dp_replicate=2, ulysses=2, device_type="cpu")
    text = describe_node_layout(state.rank_groups(), NodeLayout(8, 4))
    rows = {line.split()[0]: line for line in text.splitlines()[3:]}
    assert text.splitlines()[0] == "nodes: 2 x 4 ranks (world 8)"
    assert "inside a node" in rows["ulysses"] and "inside a node" in rows["shard"]
    assert "crosses nodes (2)" in rows["replicate"]
    assert "ring" not in rows  # one-rank groups carry nothing


def test_sub_plan_groups_are_blocks_of_shard_size():
    groups = sub_plan_rank_groups(8, 4)
    assert groups == {"shard": [[0, 1, 2, 3], [4, 5, 6, 7]], "replicate": [[0, 4], [1, 5], [2, 6], [3, 7]]}


def test_ranks_per_node_must_divide_the_world():
    with pytest.raises(ValueError, match="3 ranks per node do not divide the world size 8"):
        NodeLayout(8, 3)


def test_from_env_reads_torchruns_local_world_size(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("GROUP_RANK", "1")
    layout = NodeLayout.from_env(8)
    assert (layout.num_nodes, layout.node_of(5)) == (2, 1)


def test_from_env_refuses_nodes_with_different_numbers_of_ranks(monkeypatch):
    monkeypatch.setenv(
        "LOCAL_WORLD_SIZE", "2"
    )  # this node runs 2, but rank 5 sits on node 1: the first ran 4
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("GROUP_RANK", "1")
    with pytest.raises(ValueError, match="same --nproc-per-node"):
        NodeLayout.from_env(8)
