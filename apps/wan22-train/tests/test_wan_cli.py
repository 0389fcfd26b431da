"""`wan22-train sample` and `export` on a finished run, as a user types them (single process)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_sample_and_export_read_the_run_saved_at_world_size_2(tmp_path):
    out = tmp_path / "tiny"
    run = [sys.executable, "-m", "wan22_train"]
    subprocess.run([*run, "demo", "--out", str(out), "--steps", "2"], check=True, capture_output=True)
    assert json.loads((out / "ckpt" / "iter_0000002" / "mm_checkpoint.json").read_text())["world_size"] == 2
    clip, folder = tmp_path / "clip.mp4", tmp_path / "transformer"
    for cmd in (
        [
            "sample",
            "--checkpoint",
            str(out / "ckpt"),
            "--prompt",
            "a red square moving left",
            "--out",
            str(clip),
        ],
        ["export", "--checkpoint", str(out / "ckpt"), "--out", str(folder)],
    ):
        proc = subprocess.run([*run, *cmd], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert clip.stat().st_size > 0 and (folder / "config.json").is_file()
