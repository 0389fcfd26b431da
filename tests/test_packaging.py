"""Each library and app is its own package with its own version, and installs from the checkout with
its sibling libraries the way every README says: `hatch run wheels`, then
`pip install --find-links dist <member>`, in a fresh virtual environment."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

REPO = Path(__file__).resolve().parents[1]
MEMBERS = sorted([*REPO.glob("libs/*/pyproject.toml"), *REPO.glob("apps/*/pyproject.toml")])
TORCH = "torch==2.13.0"  # the tested version; pip takes the machine's local CPU wheel

pytestmark = pytest.mark.slow


def _run(*cmd: object, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, check=False, **kwargs)
    assert done.returncode == 0, f"{cmd} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done


def _version(member: Path) -> str:
    package = next((member / "src").iterdir())
    return re.search(r'__version__ = "([^"]+)"', (package / "__init__.py").read_text()).group(1)


def _fresh_venv(path: Path) -> Path:
    _run(sys.executable, "-m", "venv", path)  # no --system-site-packages: nothing leaks in
    return path / "bin"


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


@pytest.fixture(scope="module")
def wan22_venv(wheels: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    bin_dir = _fresh_venv(tmp_path_factory.mktemp("wan22") / "venv")
    _run(bin_dir / "pip", "install", "-q", TORCH, "--find-links", wheels, "wan22-train")
    return bin_dir


def test_wan22_train_installed_from_the_wheels_reports_its_version(wan22_venv: Path):
    out = _run(wan22_venv / "wan22-train", "--version").stdout.strip()
    assert out == f"wan22-train {_version(REPO / 'apps' / 'wan22-train')}"


def test_wan22_train_installed_from_the_wheels_makes_a_tiny_model_set(wan22_venv: Path, tmp_path: Path):
    _run(
        wan22_venv / "wan22-train", "make-tiny", tmp_path / "tiny", env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    for part in ("transformer", "vae", "text_encoder", "tokenizer"):
        assert (tmp_path / "tiny" / part).is_dir(), part
    assert (tmp_path / "tiny" / "data" / "metadata.json").is_file()
    assert any((tmp_path / "tiny" / "data").rglob("*.mp4"))


def test_mm_config_installs_alone_and_imports_no_torch(tmp_path: Path):
    bin_dir = _fresh_venv(tmp_path / "venv")
    _run(bin_dir / "pip", "install", "-q", REPO / "libs" / "mm-config")
    probe = "import sys, mm_config; assert 'torch' not in sys.modules; print(mm_config.__version__)"
    assert _run(bin_dir / "python", "-c", probe).stdout.strip() == _version(REPO / "libs" / "mm-config")
    example = REPO / "apps" / "wan22-train" / "configs" / "t2v_a14b_high.yaml"
    _run(bin_dir / "mm-config", "check", example, "--world-size", "8", "--no-plugins")
