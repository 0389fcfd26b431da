"""`wan22-train sample` and `export` on a finished run, as a user types them (single process).

The run they read trains on 2 forked gloo ranks (``main_forked``); the demo tests cover the torchrun launch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from wan22_train.cli import main as wan22_main
from wan22_train.configs import config_path
from wan22_train.tiny import make_tiny, tiny_overrides

pytestmark = pytest.mark.slow


def test_sample_and_export_read_the_run_saved_at_world_size_2(tmp_path, main_forked):
    out = make_tiny(tmp_path / "tiny")
    train = ["--config", str(config_path("tiny_t2v.yaml")), *tiny_overrides(out), f"training.save={out / 'ckpt'}",
             "training.train_iters=2"]  # fmt: skip
    main_forked(wan22_main, train, nproc=2)
    run = [sys.executable, "-m", "wan22_train"]
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
