"""Each library and app is its own package with its own version, and installs from the checkout with
its sibling libraries the way every README says: `hatch run wheels`, then
`pip install --find-links dist <member>`, in a fresh virtual environment.

A fresh install costs minutes on a small machine, so one venv grows in stages, each checked before
the next is installed: mm-config alone (no torch); then mm-checkpoint with torch at the tested
version (no diffusers / transformers / trainer): its `mm-ckpt` converts a tiny diffusers Wan
transformer to the native layout with the shipped `wan2_2` table and back, and its README example
runs; then wan22-train with everything it needs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import tomllib
import torch
from mm_checkpoint.dcp_io import DcpReader
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[1]
MEMBERS = sorted([*REPO.glob("libs/*/pyproject.toml"), *REPO.glob("apps/*/pyproject.toml")])
TORCH = "torch==2.13.0"  # the tested version; pip takes the machine's local CPU wheel
CONFIG_EXAMPLE = REPO / "apps" / "wan22-train" / "configs" / "t2v_a14b_high.yaml"
NOT_WITH_MM_CHECKPOINT = ("diffusers", "transformers", "safetensors", "mm_trainer", "wan22_train")

# The staged installs run in the first test's setup: ~4 min of CPU on 2 idle cores, more when shared.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def _run(*cmd: object, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, check=False, **kwargs)
    if check:
        assert done.returncode == 0, f"{cmd} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done


def _version(member: Path) -> str:
    package = next((member / "src").iterdir())
    return re.search(r'__version__ = "([^"]+)"', (package / "__init__.py").read_text()).group(1)


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(file)))
    return out


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The README's `hatch run wheels`: hatch.toml's script, run with this environment's tools."""
    script = tomllib.loads((REPO / "hatch.toml").read_text())["envs"]["default"]["scripts"]["wheels"]
    out = tmp_path_factory.mktemp("dist")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    _run("bash", "-c", script.replace("{args:dist}", str(out)), cwd=REPO, env=env)
    return out


def test_wheels_script_builds_every_member_with_its_own_version(wheels: Path):
    built = sorted(w.name for w in wheels.glob("*.whl"))
    expected = [f"{m.parent.name.replace('-', '_')}-{_version(m.parent)}-py3-none-any.whl" for m in MEMBERS]
    assert built == sorted(expected)


@dataclass
class Installed:
    """What each stage did in the one venv; ``bin`` is the venv with wan22-train in the end."""

    config_probe: subprocess.CompletedProcess
    config_check: subprocess.CompletedProcess
    present_with_mm_checkpoint: str
    wan_dir: Path
    converted: Path  # the native DCP copy that mm-ckpt wrote
    back: Path  # and converted back to diffusers
    readme_example: subprocess.CompletedProcess
    bin: Path


def _tiny_diffusers_wan(out: Path) -> Path:
    """A tiny diffusers Wan transformer, written here (this environment has diffusers), in shards."""
    from wan22_train.tiny import tiny_transformer

    torch.manual_seed(0)
    tiny_transformer().save_pretrained(out, max_shard_size="20KB", safe_serialization=True)
    return out


@pytest.fixture(scope="module")
def installed(wheels: Path, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    work = tmp_path_factory.mktemp("members")
    _run(sys.executable, "-m", "venv", work / "venv")  # no --system-site-packages: nothing leaks in
    bin_dir = work / "venv" / "bin"
    # pip is no project code: it runs without the suite's PYTHONWARNINGS=error (the venv's pip warns
    # that pkg_resources is deprecated); the installed members still run under it.
    # --no-compile: byte-compiling every installed module (torch's and diffusers' thousands) took
    # about 40% of this fixture; the few modules these tests import compile when first imported
    pip = [
        *("env", "-u", "PYTHONWARNINGS", bin_dir / "pip"),
        *("install", "-q", "--no-compile", "--find-links", wheels),
    ]

    _run(*pip, "mm-config")
    probe = "import sys, mm_config; assert 'torch' not in sys.modules; print(mm_config.__version__)"
    config_probe = _run(bin_dir / "python", "-c", probe, check=False)
    check = [
        bin_dir / "mm-config",
        "check",
        CONFIG_EXAMPLE,
        "--world-size",
        "8",
        "--no-plugins",
        "--no-path-check",
    ]
    config_check = _run(*check, check=False)

    _run(*pip, TORCH, "mm-checkpoint")
    probe = f"import importlib.util as u; print([m for m in {NOT_WITH_MM_CHECKPOINT} if u.find_spec(m)])"
    present = _run(bin_dir / "python", "-c", probe).stdout.strip()
    wan_dir = _tiny_diffusers_wan(work / "wan")
    ckpt = [bin_dir / "mm-ckpt", "convert", "--model-type", "wan2_2"]
    _run(*ckpt, wan_dir, work / "dcp", "--to", "dcp")
    _run(*ckpt, work / "dcp", work / "back", "--to", "diffusers")
    readme = REPO / "libs" / "mm-checkpoint" / "README.md"
    code = re.findall(r"```python\n(.*?)```", readme.read_text(), re.S)[0]
    (work / "example.py").write_text(code.replace("/tmp/demo", str(work / "demo")))
    example = _run(bin_dir / "python", work / "example.py", cwd=work, check=False)

    _run(*pip, TORCH, "wan22-train")
    return Installed(
        config_probe, config_check, present, wan_dir, work / "dcp", work / "back", example, bin_dir
    )


def test_mm_config_installs_alone_and_imports_no_torch(installed: Installed):
    assert installed.config_probe.returncode == 0, installed.config_probe.stderr
    assert installed.config_probe.stdout.strip() == _version(REPO / "libs" / "mm-config")


def test_mm_config_alone_checks_a_shipped_config(installed: Installed):
    assert installed.config_check.returncode == 0, installed.config_check.stderr
    assert "train_iters" in installed.config_check.stdout


def test_mm_checkpoint_installs_without_diffusers_transformers_or_the_trainer(installed: Installed):
    assert installed.present_with_mm_checkpoint == "[]"


def test_mm_ckpt_alone_converts_diffusers_wan_to_the_native_layout(installed: Installed):
    native = DcpReader(installed.converted / "iter_0000000").keys()
    assert "blocks.0.self_attn.q.weight" in native and "head.modulation" in native
    assert not [k for k in native if "attn1" in k or "condition_embedder" in k]


def test_mm_ckpt_alone_converts_native_back_to_diffusers_bit_exact(installed: Installed):
    source, back = _tensors(installed.wan_dir), _tensors(installed.back)
    assert source.keys() == back.keys()
    for key, tensor in source.items():
        assert tensor.dtype == back[key].dtype, key
        assert tensor.view(torch.uint8).equal(back[key].view(torch.uint8)), key


def test_mm_checkpoint_readme_example_runs_with_mm_checkpoint_alone(installed: Installed):
    assert installed.readme_example.returncode == 0, installed.readme_example.stderr[-3000:]
    assert "dcp 4 []" in installed.readme_example.stdout


def test_wan22_train_installed_from_the_wheels_reports_its_version(installed: Installed):
    out = _run(installed.bin / "wan22-train", "--version").stdout.strip()
    assert out == f"wan22-train {_version(REPO / 'apps' / 'wan22-train')}"


def test_wan22_train_installed_from_the_wheels_makes_a_tiny_model_set(installed: Installed, tmp_path: Path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    _run(installed.bin / "wan22-train", "make-tiny", tmp_path / "tiny", "--vae-fit-steps", "0", env=env)
    for part in ("transformer", "vae", "text_encoder", "tokenizer"):
        assert (tmp_path / "tiny" / part).is_dir(), part
    assert (tmp_path / "tiny" / "data" / "metadata.json").is_file()
    assert any((tmp_path / "tiny" / "data").rglob("*.mp4"))
