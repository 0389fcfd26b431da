"""``wan22-train --dry-run --nnodes N --nproc-per-node M``: the A14B config's process groups and the nodes
each spans (built on the meta device: no weights, no process group)."""

from __future__ import annotations

import pytest
from wan22_train.cli import main
from wan22_train.configs import config_path


def layout_rows(capsys, *args: str) -> dict[str, str]:
    """The rows of the node layout table ``--dry-run`` prints, by group name."""
    assert main(["--config", str(config_path("t2v_a14b_high.yaml")), "--dry-run", "--no-plan", *args]) == 0
    out = capsys.readouterr().out
    table = out[out.index("nodes: ") :].splitlines()
    return {"title": table[0], **{line.split()[0]: line for line in table[3:]}}


def test_two_nodes_of_four_with_ulysses_2_keep_cp_and_shard_groups_inside_a_node(capsys):
    rows = layout_rows(
        capsys, "--nnodes", "2", "--nproc-per-node", "4", "parallel.ulysses_parallel_size=2",
        "parallel.ring_attention_size=1",
    )  # fmt: skip
    assert rows["title"] == "nodes: 2 x 4 ranks (world 8)"
    assert rows["ulysses"].split()[:3] == ["ulysses", "2", "4"] and "inside a node" in rows["ulysses"]
    assert rows["shard"].split()[:3] == ["shard", "4", "2"] and "inside a node" in rows["shard"]
    assert "crosses nodes (2)" in rows["replicate"]  # replicate_parallel_size: auto = one replica per node


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--dry-run", "--nnodes", "2"], "--nnodes needs --nproc-per-node"),
        (["--nnodes", "2", "--nproc-per-node", "4"], "describe the layout of a --dry-run"),
        (
            ["--dry-run", "--world-size", "4", "--nnodes", "2", "--nproc-per-node", "4"],
            "--world-size 4 != --nnodes 2",
        ),
    ],
)
def test_node_options_that_do_not_describe_a_dry_run_layout_are_refused(capsys, args, message):
    with pytest.raises(SystemExit):
        main(["--config", str(config_path("t2v_a14b_high.yaml")), *args])
    assert message in capsys.readouterr().err
