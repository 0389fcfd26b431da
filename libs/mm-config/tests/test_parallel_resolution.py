"""``fully_shard_parallel_size: auto`` and the derived sizes, for world sizes 1, 2, 4 and 8."""

from __future__ import annotations

import pytest
from mm_config import ParallelConfig


@pytest.mark.parametrize(
    ("world", "replicate", "ulysses", "ring", "shard", "dp"),
    [
        (1, 1, 1, 1, 1, 1),
        (2, 1, 1, 1, 2, 2),
        (2, 1, 2, 1, 2, 1),
        (2, 1, 1, 2, 2, 1),
        (2, 2, 1, 1, 1, 2),
        (4, 1, 2, 2, 4, 1),
        (4, 1, 4, 1, 4, 1),
        (4, 2, 2, 1, 2, 2),
        (4, 1, 1, 2, 4, 2),
        (8, 1, 4, 2, 8, 1),
        (8, 1, 8, 1, 8, 1),
        (8, 2, 2, 2, 4, 2),
        (8, 4, 1, 2, 2, 4),
        (8, 1, 2, 1, 8, 4),
    ],
)
def test_auto_resolves_shard_degree_and_replicate_parallel_size(
    load, world, replicate, ulysses, ring, shard, dp
):
    cfg = load(
        {
            "parallel": {
                "replicate_parallel_size": replicate,
                "ulysses_parallel_size": ulysses,
                "ring_attention_size": ring,
            },
            "training": {"micro_batch_size": 2},
        },
        world_size=world,
    )
    p = cfg.parallel
    assert p.fully_shard_parallel_size == shard == world // replicate
    assert p.cp_size == ulysses * ring
    assert p.dp_size == dp == world // (ulysses * ring)
    assert p.dp_shard_size == shard // (ulysses * ring)
    assert p.world_size == world
    assert cfg.training.global_batch_size == 2 * dp


def test_explicit_shard_degree_matching_the_world_is_kept(load):
    cfg = load({"parallel": {"fully_shard_parallel_size": 4, "replicate_parallel_size": 2}}, world_size=8)
    assert cfg.parallel.fully_shard_parallel_size == 4 and cfg.parallel.dp_size == 8


def test_world_size_falls_back_to_env_then_1(load, monkeypatch, write_config):
    from mm_config import load_config

    monkeypatch.setenv("WORLD_SIZE", "4")
    assert load_config(write_config({"parallel": {}})).parallel.fully_shard_parallel_size == 4
    monkeypatch.delenv("WORLD_SIZE")
    assert load_config(write_config({"parallel": {}})).parallel.fully_shard_parallel_size == 1


def test_unresolved_section_refuses_derived_sizes():
    with pytest.raises(ValueError, match="is 'auto'"):
        _ = ParallelConfig().dp_size


def test_global_batch_size_that_matches_is_accepted(load):
    cfg = load(
        {
            "parallel": {"ulysses_parallel_size": 2},
            "training": {"micro_batch_size": 2, "gradient_accumulation_steps": 3, "global_batch_size": 24},
        },
        world_size=8,
    )
    assert cfg.training.global_batch_size == 24


@pytest.mark.parametrize(
    ("world", "ulysses", "accumulation"), [(1, 1, 4), (2, 1, 2), (2, 2, 4), (4, 2, 2), (4, 1, 1)]
)
def test_global_batch_size_derives_gradient_accumulation_at_any_world_size(
    load, world, ulysses, accumulation
):
    cfg = load(
        {
            "parallel": {"ulysses_parallel_size": ulysses},
            "training": {"micro_batch_size": 2, "global_batch_size": 8},
        },
        world_size=world,
    )
    assert cfg.training.gradient_accumulation_steps == accumulation and cfg.training.global_batch_size == 8


@pytest.mark.parametrize(
    ("world", "per_node", "ulysses", "ring", "replicate"),
    [
        (8, 8, 1, 1, 1),  # one node: plain FSDP
        (8, 4, 1, 1, 2),  # two nodes: one replica per node
        (8, 4, 2, 1, 2),  # Ulysses 2 fits in a node
        (16, 4, 2, 4, 2),  # CP 8 needs two nodes: one replica per pair of nodes
        (8, 2, 1, 1, 4),
    ],
)
def test_auto_replicate_parallel_size_is_one_replica_per_node(
    world, per_node, ulysses, ring, replicate, write_config
):
    from mm_config import load_config

    data = {"parallel": {"ulysses_parallel_size": ulysses, "ring_attention_size": ring}}
    p = load_config(write_config(data), world_size=world, ranks_per_node=per_node).parallel
    assert p.replicate_parallel_size == replicate and p.fully_shard_parallel_size == world // replicate


def test_auto_replicate_parallel_size_reads_the_launchers_ranks_per_node(load, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert load({"parallel": {}}, world_size=8).parallel.replicate_parallel_size == 2
    # LOCAL_WORLD_SIZE belongs to the launcher's world; a dry run for another world is one node
    assert load({"parallel": {}}, world_size=16).parallel.replicate_parallel_size == 1


def test_an_explicit_replicate_parallel_size_wins_over_the_node_layout(write_config):
    from mm_config import load_config

    cfg = load_config(
        write_config({"parallel": {"replicate_parallel_size": 1}}), world_size=8, ranks_per_node=4
    )
    assert cfg.parallel.replicate_parallel_size == 1 and cfg.parallel.fully_shard_parallel_size == 8


def test_ranks_per_node_that_do_not_divide_the_world_are_refused(write_config):
    from mm_config import load_config

    with pytest.raises(ValueError, match="3 ranks per node do not divide the world size 8"):
        load_config(write_config({"parallel": {}}), world_size=8, ranks_per_node=3)


def test_auto_replicate_parallel_size_follows_an_explicit_shard_degree(write_config):
    from mm_config import load_config

    data = {"parallel": {"fully_shard_parallel_size": 2}}
    assert (
        load_config(write_config(data), world_size=8, ranks_per_node=8).parallel.replicate_parallel_size == 4
    )


def test_mm_config_check_resolves_for_the_ranks_per_node_given(write_config, capsys):
    from mm_config.cli import main

    path = str(write_config({"parallel": {}}))
    assert main(["check", path, "--world-size", "8", "--nproc-per-node", "4", "--no-path-check"]) == 0
    assert "replicate_parallel_size: 2" in capsys.readouterr().out
    assert main(["check", path, "--world-size", "8", "--nproc-per-node", "3", "--no-path-check"]) != 0
    assert "3 ranks per node do not divide the world size 8" in capsys.readouterr().err
