"""What a finished `mm-train` run leaves for its user: console lines saying where its files are, plain
log lines in a log file, and a checkpoint that records its sub-models so `mm-ckpt` exports one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

pytestmark = pytest.mark.slow


def test_a_run_without_a_terminal_names_its_paths_and_logs_one_line_per_log_step(toy_yaml, mm_train):
    config = toy_yaml(training={"train_iters": 4, "log_interval": 2, "save_interval": 100})
    proc = mm_train(config)  # output captured: no terminal, as in a log file
    save = config.parent / "ckpt"
    out = proc.stdout.splitlines()
    assert f"mm-train: run directory: {save} (new run, 4 iterations)" in out
    assert f"mm-train: run directory: {save} (stopped at iteration 4 of 4)" in out
    assert f"mm-train: last checkpoint: {save / 'iter_0000004'}" in out
    assert out.count(f"mm-train: metrics:       {save / 'metrics.jsonl'}") == 2
    steps = [line for line in proc.stderr.splitlines() if line.startswith("step ")]
    assert [line.split(" | ")[0] for line in steps] == ["step 2/4", "step 4/4"]
    assert all(" | loss " in line and " | eta " in line for line in steps)
    assert "\r" not in proc.stderr


def test_mm_ckpt_exports_a_run_checkpoint_only_as_a_chosen_sub_model(toy_yaml, mm_train, tmp_path: Path):
    config = toy_yaml(training={"train_iters": 2, "save_interval": 100})
    mm_train(config)
    convert = [sys.executable, "-m", "mm_checkpoint", "convert", str(config.parent / "ckpt")]
    refused = subprocess.run([*convert, str(tmp_path / "all"), "--to", "hf"], capture_output=True, text=True)
    assert refused.returncode == 2 and "sub-models ['predictor']" in refused.stderr
    assert not (tmp_path / "all").exists()
    done = subprocess.run(
        [*convert, str(tmp_path / "predictor"), "--to", "hf", "--submodel", "predictor"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    keys = load_file(str(tmp_path / "predictor" / "model.safetensors"))
    assert "head.weight" in keys and not [k for k in keys if k.startswith("predictor.")]
