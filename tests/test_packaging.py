"""Each library and app is its own package with its own version, and installs from the checkout with
its sibling libraries the way every README says: `hatch run wheels`, then
`pip install --find-links dist <member>`, in a fresh virtual environment.

One venv serves every check (each fresh install costs minutes on a small machine): mm-config goes in
first, alone, and is checked before anything else (torch included) is installed; wan22-train follows.
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

REPO = Path(__file__).resolve().parents[1]
MEMBERS = sorted([*REPO.glob("libs/*/pyproject.toml"), *REPO.glob("apps/*/pyproject.toml")])
TORCH = "torch==2.13.0"  # the tested version; pip takes the machine's local CPU wheel
CONFIG_EXAMPLE = REPO / "apps" / "wan22-train" / "configs" / "t2v_a14b_high.yaml"

pytestmark = pytest.mark.slow


def _run(*cmd: object, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, check=False, **kwargs)
    if check:
        assert done.returncode == 0, f"{cmd} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done


def _version(member: Path) -> str:
    package = next((member / "src").iterdir())
    return re.search(r'__version__ = "([^"]+)"', (package / "__init__.py").read_text()).group(1)


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
    """One fresh venv: what mm-config alone did in it, then the venv with wan22-train added."""

    config_probe: subprocess.CompletedProcess
    config_check: subprocess.CompletedProcess
    bin: Path


@pytest.fixture(scope="module")
def installed(wheels: Path, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    venv = tmp_path_factory.mktemp("members") / "venv"
    _run(sys.executable, "-m", "venv", venv)  # no --system-site-packages: nothing leaks in
    bin_dir = venv / "bin"
    _run(bin_dir / "pip", "install", "-q", "--find-links", wheels, "mm-config")
    probe = "import sys, mm_config; assert 'torch' not in sys.modules; print(mm_config.__version__)"
    config_probe = _run(bin_dir / "python", "-c", probe, check=False)
    check = [bin_dir / "mm-config", "check", CONFIG_EXAMPLE, "--world-size", "8", "--no-plugins", "--no-path-check"]
    config_check = _run(*check, check=False)
    _run(bin_dir / "pip", "install", "-q", TORCH, "--find-links", wheels, "wan22-train")
    return Installed(config_probe, config_check, bin_dir)


def test_mm_config_installs_alone_and_imports_no_torch(installed: Installed):
    assert installed.config_probe.returncode == 0, installed.config_probe.stderr
    assert installed.config_probe.stdout.strip() == _version(REPO / "libs" / "mm-config")


def test_mm_config_alone_checks_a_shipped_config(installed: Installed):
    assert installed.config_check.returncode == 0, installed.config_check.stderr
    assert "train_iters" in installed.config_check.stdout


def test_wan22_train_installed_from_the_wheels_reports_its_version(installed: Installed):
    out = _run(installed.bin / "wan22-train", "--version").stdout.strip()
    assert out == f"wan22-train {_version(REPO / 'apps' / 'wan22-train')}"


def test_wan22_train_installed_from_the_wheels_makes_a_tiny_model_set(installed: Installed, tmp_path: Path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    _run(installed.bin / "wan22-train", "make-tiny", tmp_path / "tiny", env=env)
    for part in ("transformer", "vae", "text_encoder", "tokenizer"):
        assert (tmp_path / "tiny" / part).is_dir(), part
    assert (tmp_path / "tiny" / "data" / "metadata.json").is_file()
    assert any((tmp_path / "tiny" / "data").rglob("*.mp4"))
