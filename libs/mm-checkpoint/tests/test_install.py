"""``pip install ./libs/mm-checkpoint`` alone, in a fresh venv, gives a working ``mm-ckpt``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

LIB = Path(__file__).resolve().parents[1]


def _run(*cmd: str | Path) -> str:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"{cmd} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.mark.slow
def test_fresh_venv_install_gives_working_cli(umt5_dir: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", venv)  # no --system-site-packages: nothing leaks in
    _run(venv / "bin" / "pip", "install", "-q", "torch==2.13.0", LIB)  # torch from the local wheel
    absent = subprocess.run(
        [venv / "bin" / "python", "-c", "import diffusers"], capture_output=True, check=False
    )
    assert absent.returncode != 0  # mm-checkpoint alone pulls in no diffusers / transformers
    cli = venv / "bin" / "mm-ckpt"
    _run(cli, "convert", umt5_dir, tmp_path / "dcp", "--to", "dcp")
    _run(cli, "convert", tmp_path / "dcp", tmp_path / "hf", "--to", "hf")
    assert "SAME" in _run(cli, "verify", umt5_dir, tmp_path / "hf")
