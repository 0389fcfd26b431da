"""mm-checkpoint installed alone (torch at the tested version, no diffusers / transformers) in a fresh
venv: `mm-ckpt` converts a tiny diffusers Wan transformer to the native layout with the shipped
`wan2_2` key map and back, bit-exact, and the README's Python example runs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mm_checkpoint.dcp_io import DcpReader
from safetensors.torch import load_file

LIB = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def _run(*cmd: str | Path, cwd: Path | None = None) -> str:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, check=False, cwd=cwd)
    assert done.returncode == 0, f"{cmd} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done.stdout


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(file)))
    return out


@pytest.fixture(scope="module")
def venv_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    venv = tmp_path_factory.mktemp("mm_checkpoint_alone") / "venv"
    _run(sys.executable, "-m", "venv", venv)  # no --system-site-packages: nothing leaks in
    _run(venv / "bin" / "pip", "install", "-q", "torch==2.13.0", LIB)  # torch from the local wheel
    return venv / "bin"


def test_nothing_but_mm_checkpoint_and_its_dependencies_is_installed(venv_bin: Path) -> None:
    probe = "import importlib.util as u; print([m for m in ('diffusers', 'transformers', 'safetensors') if u.find_spec(m)])"
    assert _run(venv_bin / "python", "-c", probe).strip() == "[]"


def test_mm_ckpt_alone_converts_diffusers_wan_to_native_and_back_bit_exact(
    venv_bin: Path, wan_dir: Path, tmp_path: Path
) -> None:
    cli = venv_bin / "mm-ckpt"
    _run(cli, "convert", wan_dir, tmp_path / "dcp", "--to", "dcp", "--model-type", "wan2_2")
    native = DcpReader(tmp_path / "dcp" / "iter_0000000").keys()
    assert "blocks.0.self_attn.q.weight" in native and "head.modulation" in native
    assert not [k for k in native if "attn1" in k or "condition_embedder" in k]
    _run(cli, "convert", tmp_path / "dcp", tmp_path / "back", "--to", "diffusers", "--model-type", "wan2_2")
    source, back = _tensors(wan_dir), _tensors(tmp_path / "back")
    assert source.keys() == back.keys()
    for key, tensor in source.items():
        assert tensor.dtype == back[key].dtype and tensor.view(torch.uint8).equal(
            back[key].view(torch.uint8)
        ), key


def test_readme_python_example_runs(venv_bin: Path, tmp_path: Path) -> None:
    code = re.findall(r"```python\n(.*?)```", (LIB / "README.md").read_text(), re.S)[0]
    script = tmp_path / "example.py"
    script.write_text(code.replace("/tmp/demo", str(tmp_path / "demo")))
    assert "dcp 4 []" in _run(venv_bin / "python", script, cwd=tmp_path)
