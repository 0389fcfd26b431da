"""Temporaries of interrupted node-local copies are removed by the next copier, and only those."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from mm_checkpoint import remove_stale_temporaries, stage_on_node
from mm_checkpoint.stage_temporaries import temporary_path


def write_source(folder: Path) -> Path:
    folder.mkdir(parents=True)
    for i in range(3):
        (folder / f"shard{i}.bin").write_bytes(bytes([i]) * 64)
    return folder


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True
    )
    return int(proc.stdout)


def interrupted_copy(fork, source: Path, stage_root: Path) -> Path:
    """Stage ``source`` in a child process (forked by the root conftest's ``fork``) that dies
    (``os._exit``) after copying one file; return what it left behind."""
    pid = fork()
    if pid == 0:  # the child: a copier killed in the middle of its copy
        copied, real_copytree = [], shutil.copytree

        def copytree_dying_after_one_file(src, dst, copy_function=shutil.copy2, **kwargs):  # noqa: ANN001, ANN202
            def copy_then_die(s, d):  # noqa: ANN001, ANN202
                if copied:
                    os._exit(9)
                copied.append(s)
                return copy_function(s, d)

            return real_copytree(src, dst, copy_function=copy_then_die, **kwargs)

        shutil.copytree = copytree_dying_after_one_file
        try:
            stage_on_node(source, stage_root)
        finally:
            os._exit(1)  # not reached when the copy is interrupted
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 9
    left = [p for p in stage_root.iterdir() if ".tmp-" in p.name]
    assert len(left) == 1 and left[0].name.endswith(f"-{pid}")
    return left[0]


def test_the_next_run_removes_the_temporary_of_an_interrupted_copy(tmp_path, fork):
    source = write_source(tmp_path / "model")
    left = interrupted_copy(fork, source, tmp_path / "stage")
    assert len(list(left.iterdir())) == 1  # a partial copy: one of the three files
    staged = stage_on_node(source, tmp_path / "stage")
    assert staged.copied and sorted(p.name for p in staged.path.iterdir()) == [
        ".mm_stage.json", "shard0.bin", "shard1.bin", "shard2.bin",
    ]  # fmt: skip
    assert sorted(p.name for p in (tmp_path / "stage").iterdir()) == [staged.path.name]


def test_only_temporaries_of_gone_copiers_of_this_host_are_removed(tmp_path):
    root = tmp_path / "stage"
    own = temporary_path(root / "model-abc")  # this process: alive
    gone = temporary_path(root / "model-def", pid=dead_pid())
    claimed = temporary_path(gone, pid=dead_pid())  # a cleaner killed while removing `gone`
    legacy = root / f"model-abc.tmp-{dead_pid()}"  # the name before the host was part of it
    other_host = root / f"model-abc.tmp-some-other-host-{dead_pid()}"  # its pid means nothing here
    unrelated = root / "model-abc.tmp-notes"
    for folder in (own, gone, claimed, legacy, other_host, unrelated):
        folder.mkdir(parents=True)
        (folder / "weights.bin").write_bytes(b"x")
    assert sorted(remove_stale_temporaries(root)) == sorted([gone, claimed, legacy])
    assert sorted(p.name for p in root.iterdir()) == sorted([own.name, other_host.name, unrelated.name])
