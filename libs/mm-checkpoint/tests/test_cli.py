"""The ``mm-ckpt`` command line: convert, inspect, verify, and exit codes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from mm_checkpoint.cli import main
from safetensors.torch import load_file, save_file


def test_convert_to_dcp_and_back_then_verify_same(
    umt5_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert main(["convert", str(umt5_dir), str(tmp_path / "dcp"), "--to", "dcp"]) == 0
    assert (
        main(
            ["convert", str(tmp_path / "dcp"), str(tmp_path / "hf"), "--to", "hf", "--max-shard-size", "10KB"]
        )
        == 0
    )
    assert (tmp_path / "hf" / "model.safetensors.index.json").is_file()
    capsys.readouterr()
    assert main(["verify", str(umt5_dir), str(tmp_path / "hf")]) == 0
    assert "max abs diff 0" in capsys.readouterr().out
    assert main(["verify", str(umt5_dir), str(tmp_path / "dcp")]) == 0


def test_verify_reports_differences_with_exit_code_one(
    umt5_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    changed = tmp_path / "changed"
    changed.mkdir()
    tensors = {}
    for f in sorted(umt5_dir.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    tensors["shared.weight"] = tensors["shared.weight"] + 0.5
    del tensors["encoder.final_layer_norm.weight"]
    save_file(tensors, str(changed / "model.safetensors"))
    assert main(["verify", str(umt5_dir), str(changed)]) == 1
    out = capsys.readouterr().out
    assert (
        "max abs diff 0.5 (shared.weight)" in out
        and "only in A (1): ['encoder.final_layer_norm.weight']" in out
    )


def test_inspect_prints_format_count_and_bytes(wan_dir: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["inspect", str(wan_dir)]) == 0
    out = capsys.readouterr().out
    assert "format:  diffusers" in out and "tensors: 69" in out and "float32" in out


@pytest.mark.parametrize(
    "argv",
    [
        ["inspect", "/no/such/dir"],
        ["convert", "/no/such/dir", "/tmp/x", "--to", "dcp"],
        ["convert", "a", "b", "--to", "pickle"],
    ],
)
def test_bad_input_exits_2_with_message(argv: list[str], capsys: pytest.CaptureFixture) -> None:
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith("mm-ckpt: error:")


def test_converting_safetensors_to_safetensors_points_to_dcp(
    umt5_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert main(["convert", str(umt5_dir), str(tmp_path / "x"), "--to", "diffusers"]) == 2
    assert "--to dcp first" in capsys.readouterr().err


def test_python_dash_m_runs_the_cli(wan_dir: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "mm_checkpoint", "inspect", str(wan_dir), "--json"],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert '"format": "diffusers"' in done.stdout
