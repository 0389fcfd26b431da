"""Each library and app is its own package: it builds a wheel alone, with its own version."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MEMBERS = sorted([*REPO.glob("libs/*/pyproject.toml"), *REPO.glob("apps/*/pyproject.toml")])

pytestmark = pytest.mark.slow


def _run(*cmd: object) -> subprocess.CompletedProcess:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"{cmd} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done


def _version(member: Path) -> str:
    package = next((member / "src").iterdir())
    return re.search(r'__version__ = "([^"]+)"', (package / "__init__.py").read_text()).group(1)


@pytest.mark.parametrize("pyproject", MEMBERS, ids=[p.parent.name for p in MEMBERS])
def test_member_builds_a_wheel_alone_with_its_own_version(pyproject: Path, tmp_path: Path):
    member = pyproject.parent
    _run(sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", tmp_path, member)
    (wheel,) = tmp_path.glob("*.whl")
    assert wheel.name.startswith(f"{member.name.replace('-', '_')}-{_version(member)}-")


def test_mm_config_installs_alone_and_imports_no_torch(tmp_path: Path):
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", venv)  # no --system-site-packages: nothing leaks in
    _run(venv / "bin" / "pip", "install", "-q", REPO / "libs" / "mm-config")
    probe = "import sys, mm_config; assert 'torch' not in sys.modules; print(mm_config.__version__)"
    assert _run(venv / "bin" / "python", "-c", probe).stdout.strip() == _version(REPO / "libs" / "mm-config")
    example = REPO / "apps" / "wan22-train" / "configs" / "t2v_a14b_high.yaml"
    _run(venv / "bin" / "mm-config", "check", example, "--world-size", "8", "--no-plugins", "--no-path-check")
