"""stage_on_node: one copy per node (LOCAL_RANK 0 copies, the others wait), reused while it matches."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from mm_checkpoint import stage_on_node


def write_source(folder: Path) -> Path:
    (folder / "sub").mkdir(parents=True)
    (folder / "config.json").write_text('{"dim": 4}')
    (folder / "sub" / "weights.bin").write_bytes(b"\x01" * 64)
    return folder


def test_a_copy_holds_every_file_and_is_reused_until_the_source_changes(tmp_path):
    source = write_source(tmp_path / "model")
    first = stage_on_node(source, tmp_path / "local")
    assert first.copied and (first.path / "sub" / "weights.bin").read_bytes() == b"\x01" * 64
    assert not stage_on_node(source, tmp_path / "local").copied
    (source / "sub" / "weights.bin").write_bytes(b"\x02" * 65)
    again = stage_on_node(source, tmp_path / "local")
    assert again.copied and again.path == first.path
    assert (again.path / "sub" / "weights.bin").read_bytes() == b"\x02" * 65


@pytest.mark.parametrize("how", ["replaced", "in place"])
def test_a_same_size_same_mtime_rewrite_is_staged_again(how, tmp_path):
    source = write_source(tmp_path / "model")
    weights = source / "sub" / "weights.bin"
    first = stage_on_node(source, tmp_path / "local")
    stamp = weights.stat()
    if how == "replaced":  # a new inode
        (source / "sub" / "new.tmp").write_bytes(b"\x02" * 64)
        os.replace(source / "sub" / "new.tmp", weights)
    else:
        with open(weights, "r+b") as f:
            f.write(b"\x02" * 64)
    os.utime(weights, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    again = stage_on_node(source, tmp_path / "local")
    assert (
        again.copied
        and (again.path / "sub" / "weights.bin").read_bytes() == b"\x02" * 64 == weights.read_bytes()
    )
    assert first.path == again.path


def test_the_same_bytes_touched_are_not_copied_again(tmp_path):
    source = write_source(tmp_path / "model")
    stage_on_node(source, tmp_path / "local")
    os.utime(source / "sub" / "weights.bin", ns=(10**9, 10**9))
    assert not stage_on_node(source, tmp_path / "local").copied


def test_a_single_file_is_staged_as_a_file(tmp_path):
    source = tmp_path / "model.safetensors"
    source.write_bytes(b"abc")
    staged = stage_on_node(source, tmp_path / "local")
    assert staged.path.name == "model.safetensors" and staged.path.read_bytes() == b"abc"


def test_a_missing_source_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="cannot stage .*missing"):
        stage_on_node(tmp_path / "missing", tmp_path / "local")


@pytest.mark.slow
def test_one_rank_per_node_copies_and_a_failed_copy_raises_on_every_rank(tmp_path, distributed):
    source = write_source(tmp_path / "model")

    def body(rank: int, world: int) -> dict:
        one_node = stage_on_node(source, tmp_path / "one_node")  # LOCAL_RANK = rank: one node of 2
        os.environ["LOCAL_RANK"] = "0"  # now two nodes of one rank, each with its own local disk
        two_nodes = stage_on_node(source, tmp_path / f"node{rank}")
        blocked = tmp_path / "blocked"  # a file where node 1's stage root should be
        blocked.write_text("")
        try:
            stage_on_node(source, blocked if rank == 1 else tmp_path / "node0")
            failure = None
        except OSError as exc:
            failure = str(exc)
        return {"one_node": one_node.copied, "two_nodes": two_nodes.copied, "files": sorted(
            p.name for p in two_nodes.path.rglob("*")), "failure": failure}  # fmt: skip

    out = distributed(body, 2)
    assert [o["one_node"] for o in out] == [True, False]
    assert [o["two_nodes"] for o in out] == [True, True]
    assert out[0]["files"] == out[1]["files"] == [".mm_stage.json", "config.json", "sub", "weights.bin"]
    assert all(o["failure"] and "rank 1 could not copy" in o["failure"] for o in out)
