"""``wan22-train plan`` of a real-size shipped config, end to end: the whole step traced at 8 ranks on
fake tensors (nothing read: the config's paths are placeholders), and the report's every part."""

from __future__ import annotations

import subprocess
import sys

import pytest
from wan22_train.configs import config_path

CONFIGS = config_path("t2v_a14b_high_cached.yaml").parent
"""The shipped configs. The README's plan line names the real-size config with the least to trace: the
14B A14B expert at 480x832x81 (32,760 tokens over Ulysses 4 x Ring 2) on cached latents, without the
VAE and UMT5 passes of the online configs."""


@pytest.mark.slow
def test_a_real_size_config_plans_to_completion_and_reports_every_part(readme):
    line = "wan22-train plan --config apps/wan22-train/configs/t2v_a14b_high_cached.yaml --world-size 8 --device h200"
    argv = readme.command("apps/wan22-train/README.md", line, paths={"apps/wan22-train/configs": CONFIGS})
    command = [sys.executable, "-m", "wan22_train", *argv[1:]]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    for part in ("parameters", "gradients", "optimizer states", "EMA", "activations", "temporaries",
                 "attention kernel workspace", "communication buffers"):  # fmt: skip
        assert f"\n  {part} " in out, out
    assert "FITS on NVIDIA H200" in out and "predictor.blocks.{*}" in out and "MFU" in out, out
    assert "attention: flash x" in out, out  # the target's kernel stood in for the CPU one
    assert "micro-step 1/1: backward" in done.stderr  # progress while tracing


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--world-size", "100000000"], "is beyond what the planner traces"),
        (["--world-size", "8", "--device", "h900"], "unknown device 'h900'"),
    ],
)
def test_wan22_train_plan_refuses_bad_input_before_importing_the_wan_plugin(args, message):
    """A refused input used to be answered after the Wan plugin's imports (24 s for an unknown device) or
    never (a world of 100,000,000 grew to 14 GB): now before them, with nothing read. (What is left is
    importing mm_trainer, i.e. torch; the check itself takes milliseconds: test_planner_inputs.py.)"""
    probe = (
        "import sys; from wan22_train.cli import main; "
        f"code = main(['plan', '--config', 'configs/tiny_t2v.yaml', *{args!r}]); "
        "print(code, 'wan22_train.plugin' in sys.modules, 'diffusers' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["2", "False", "False"], done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr, done.stderr
