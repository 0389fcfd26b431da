"""The benchmark scripts keep running: each is started with its smallest settings."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _run(script: str, *args: str) -> str:
    """A benchmark's stdout (the test fails with its stderr if it exits non-zero)."""
    return subprocess.run(
        [sys.executable, script, *args], cwd=REPO, capture_output=True, text=True, timeout=300, check=True
    ).stdout


def test_wan_step_prints_the_three_models_and_the_ratio():
    small = ["--grid", "1", "4", "4", "--blocks", "1", "--dim", "64", "--heads", "2", "--ffn-dim", "128"]
    out = _run("benchmarks/wan_step.py", *small, "--text-dim", "32", "--text-len", "8", "--repeats", "1")
    for row in ("diffusers WanTransformer3DModel", "wan22_train WanDiT", "matmul skeleton (floor)"):
        assert re.search(rf"^{re.escape(row)}\s+\d+\.\d+", out, re.MULTILINE), out
    assert re.search(r"^ratio ours / diffusers: \d+\.\d{3}", out, re.MULTILINE), out


@pytest.mark.slow  # three child processes
def test_lora_step_prints_full_and_lora_memory_and_time_in_one_run():
    small = ["--dim", "64", "--heads", "2", "--blocks", "1", "--ffn-dim", "128", "--text-dim", "32"]
    small += ["--text-len", "8", "--grid", "1", "4", "4", "--rank", "4", "--repeats", "1", "--warmup", "0"]
    out = _run("benchmarks/lora_step.py", *small)
    rows = {}
    for mode in ("full", "lora", "lora, bf16 base"):
        found = re.search(rf"^{re.escape(mode)}\s+([\d,]+)\s+([\d,]+)\s+(\d+\.\d)", out, re.MULTILINE)
        assert found, out
        rows[mode] = [float(g.replace(",", "")) for g in found.groups()]
    assert rows["full"][1] == 0 and rows["lora"][1] == rows["full"][0]  # LoRA freezes the whole base
    assert rows["lora"][0] < rows["full"][0] and rows["lora"][2] < rows["full"][2]  # trainable, state MB
