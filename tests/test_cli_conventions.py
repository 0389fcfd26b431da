"""Every console script behaves like the ecosystem's: `--version`, a `--help` that lists an app's
commands, and a fast `--help` for the tools that need no torch to parse their arguments."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from importlib.metadata import distribution
from pathlib import Path

import pytest
import tomllib

REPO = Path(__file__).resolve().parents[1]
MEMBERS = sorted([*REPO.glob("libs/*/pyproject.toml"), *REPO.glob("apps/*/pyproject.toml")])
SCRIPTS = sorted(
    (name, tomllib.loads(p.read_text())["project"]["name"])
    for p in MEMBERS
    for name in tomllib.loads(p.read_text())["project"].get("scripts", {})
)
APPS = {  # each app's console script -> the module holding its COMMANDS
    name: target.split(":")[0]
    for p in REPO.glob("apps/*/pyproject.toml")
    for name, target in tomllib.loads(p.read_text())["project"]["scripts"].items()
}


def _entry_point(script: str):
    (ep,) = [ep for ep in distribution(dict(SCRIPTS)[script]).entry_points if ep.name == script]
    return ep.load()


def _exit_output(entry, argv: list[str], capsys: pytest.CaptureFixture, monkeypatch) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as done:
        entry()
    return done.value.code, capsys.readouterr().out


@pytest.mark.parametrize(("script", "dist"), SCRIPTS, ids=[s for s, _ in SCRIPTS])
def test_console_script_prints_its_name_and_version(script, dist, capsys, monkeypatch):
    code, out = _exit_output(_entry_point(script), [script, "--version"], capsys, monkeypatch)
    assert (code, out.strip()) == (0, f"{script} {distribution(dist).version}")


@pytest.mark.parametrize("app", sorted(APPS))
def test_app_help_lists_each_command_with_one_line(app, capsys, monkeypatch):
    commands = importlib.import_module(APPS[app]).COMMANDS
    code, out = _exit_output(_entry_point(app), [app, "--help"], capsys, monkeypatch)
    assert code == 0 and "--config CONFIG" in out
    for name, line in commands.items():
        assert re.search(rf"^  {re.escape(name)} +{re.escape(line)}$", out, re.M), (
            f"{name} not listed:\n{out}"
        )


@pytest.mark.parametrize("module", ["mm_checkpoint.cli", "mm_config.cli"])
def test_help_parses_arguments_without_importing_torch(module):
    probe = (
        f"import sys\nfrom {module} import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))[:5]"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
