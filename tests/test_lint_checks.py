"""`hatch run lint`'s checks: the tree passes them (so the test suite, which CI runs, runs them too),
and the formatting check (ruff format), the dependency check (deptry, per member) and architecture
check (import-linter contracts in pyproject.toml) each fail on a planted violation. Violations are planted in temporary copies, never
in the tree."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
IMPORTLINTER = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
CONTRACTS = {c["id"]: c["name"] for c in IMPORTLINTER["contracts"]}
SOURCES = {p.name: p for p in [*REPO.glob("libs/*/src/*"), *REPO.glob("apps/*/src/*")] if p.is_dir()}
SCRIPTS = tomllib.loads((REPO / "hatch.toml").read_text())["envs"]["default"]["scripts"]


def test_every_member_package_is_under_the_architecture_contracts():
    assert sorted(IMPORTLINTER["root_packages"]) == sorted(SOURCES)


@pytest.mark.slow
def test_the_tree_passes_every_check_of_hatch_run_lint():
    """`hatch run lint` without its `sync` step: ruff's rules and formatting, deptry per member,
    import-linter."""
    steps = [SCRIPTS.get(step, step) for step in SCRIPTS["lint"] if step != "sync"]
    assert FORMAT_CHECK in steps
    assert any("deptry" in step for step in steps) and any("lint-imports" in step for step in steps)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    for step in steps:
        done = subprocess.run(
            ["bash", "-c", step], capture_output=True, text=True, timeout=600, check=False, cwd=REPO, env=env
        )
        assert done.returncode == 0, f"{step}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"


FORMAT_CHECK = "ruff format --check ."
UNFORMATTED = "def planted( a,b ):\n    return {'a':a,\n      'b':b}\n"


def _format_check(tree: Path) -> subprocess.CompletedProcess:
    """`hatch run lint`'s formatting step, run in ``tree`` (which holds a copy of the root pyproject.toml)."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(["bash", "-c", FORMAT_CHECK], capture_output=True, text=True, timeout=120,
                          check=False, cwd=tree, env=env)  # fmt: skip


def test_the_lint_formatting_step_fails_on_an_unformatted_file_and_passes_once_formatted(tmp_path: Path):
    assert FORMAT_CHECK in SCRIPTS["lint"]
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")  # the tree's ruff settings
    planted = tmp_path / "libs" / "planted.py"
    planted.parent.mkdir()
    planted.write_text(UNFORMATTED)
    done = _format_check(tmp_path)
    assert done.returncode == 1 and "libs/planted.py" in done.stdout + done.stderr, done.stdout + done.stderr
    subprocess.run([BIN / "ruff", "format", planted], check=True, capture_output=True, cwd=tmp_path)
    assert planted.read_text() == 'def planted(a, b):\n    return {"a": a, "b": b}\n'
    assert _format_check(tmp_path).returncode == 0


def _copy_member(member: Path, dst: Path) -> Path:
    shutil.copytree(member, dst, ignore=shutil.ignore_patterns("__pycache__", "tests", "*.egg-info"))
    return dst


def _deptry(member: Path) -> subprocess.CompletedProcess:
    """What `hatch run deps` runs for one member (deptry reports on stderr)."""
    cmd = [BIN / "deptry", member / "src", "--config", member / "pyproject.toml", "--no-ansi"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)


def test_deptry_passes_on_an_unchanged_member_copy(tmp_path: Path):
    done = _deptry(_copy_member(REPO / "libs" / "mm-pipelines", tmp_path / "mm-pipelines"))
    assert done.returncode == 0, done.stdout + done.stderr


def test_deptry_fails_on_an_undeclared_import(tmp_path: Path):
    member = _copy_member(REPO / "libs" / "mm-pipelines", tmp_path / "mm-pipelines")
    (member / "src" / "mm_pipelines" / "planted.py").write_text("import yaml\n")
    done = _deptry(member)
    # DEP003 where another installed package pulls pyyaml in, DEP001 where nothing does
    assert done.returncode != 0 and re.search(r"DEP00[13] 'yaml' imported but", done.stderr)


def test_deptry_fails_on_a_declared_dependency_never_imported(tmp_path: Path):
    member = _copy_member(REPO / "libs" / "mm-pipelines", tmp_path / "mm-pipelines")
    pyproject = member / "pyproject.toml"
    pyproject.write_text(
        pyproject.read_text().replace("dependencies = [", 'dependencies = ["pyyaml>=6", ', 1)
    )
    done = _deptry(member)
    assert done.returncode != 0 and "DEP002 'pyyaml' defined as a dependency but not used" in done.stderr


def _lint_imports(planted_package: str, code: str, tmp_path: Path) -> str:
    """lint-imports with the repo's contracts, seeing a copy of one package with one planted module."""
    copy = tmp_path / "shadow" / planted_package
    shutil.copytree(SOURCES[planted_package], copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "planted.py").write_text(code)
    env = {**os.environ, "PYTHONPATH": str(copy.parent)}  # ahead of the editable installs
    cmd = [BIN / "lint-imports", "--no-cache", "--config", REPO / "pyproject.toml"]
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=600, check=False, env=env, cwd=tmp_path
    )
    assert done.returncode != 0, done.stdout
    return done.stdout


@pytest.mark.parametrize(
    ("package", "code", "contract"),
    [
        ("mm_config", "import torch\n", "config-without-torch"),
        ("mm_checkpoint", "from mm_parallel import ParallelState\n", "layers"),
        ("mm_data", "def f():\n    import mm_trainer\n", "layers"),
        ("wan22_train", "import ltx2_train\n", "layers"),
        ("qwen_vl_train", "from wan22_train import plugin\n", "layers"),
        ("mm_trainer", "import wan22_train\n", "layers"),
    ],
    ids=[
        "mm-config-imports-torch",
        "base-libraries-dependent",
        "base-library-imports-trainer",
        "apps-dependent",
        "new-app-imports-another",
        "trainer-imports-an-app",
    ],
)
def test_import_linter_fails_on_a_planted_import(package: str, code: str, contract: str, tmp_path: Path):
    out = " ".join(_lint_imports(package, code, tmp_path).split())  # it wraps long lines
    assert f"{CONTRACTS[contract]} BROKEN" in out and f"{package}.planted" in out, out
