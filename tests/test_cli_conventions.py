"""Every console script behaves like the ecosystem's: `--version`, a `--help` that lists an app's
commands, and `--help` (and a refused config) answered before torch is imported."""

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


ENTRY_POINTS = {
    name: tomllib.loads(p.read_text())["project"]["scripts"][name]
    for p in MEMBERS
    for name in tomllib.loads(p.read_text())["project"].get("scripts", {})
}
"""Console script -> ``module:function``, what its installed stub calls."""

PROBE = """
import sys
sys.argv = [{name!r}, *{args!r}]
from {module} import {function}
try:
    {function}()
except SystemExit as done:
    code = done.code
else:
    code = 0
torch = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))[:5]
print(f"exit {{code}}, torch modules: {{torch}}")
"""


def _probe(script: str, *args: str) -> str:
    """What the console script ``script`` does with ``args`` in a fresh interpreter: its exit code and
    the torch modules imported by then."""
    module, function = ENTRY_POINTS[script].split(":")
    code = PROBE.format(name=script, args=list(args), module=module, function=function)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("script", sorted(ENTRY_POINTS))
def test_help_answers_without_importing_torch(script):
    # benchmarks/cli_start.py times it: about a second where the whole stack took 18-31 s
    assert _probe(script, "--help") == "exit 0, torch modules: []"


def _subcommands(script: str) -> list[str]:
    """The commands ``script --help`` lists in its usage (``{make-tiny,preprocess,...}``)."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(name=script, args=["--help"], **_entry(script))],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    found = re.search(r"\{([a-z,-]+)\}", done.stdout)
    return found.group(1).split(",") if found else []


def _entry(script: str) -> dict[str, str]:
    module, function = ENTRY_POINTS[script].split(":")
    return {"module": module, "function": function}


@pytest.mark.parametrize("script", sorted(ENTRY_POINTS))
def test_every_commands_help_answers_without_importing_torch(script):
    """``wan22-train export --help`` as quick as ``wan22-train --help``: each command's parser is
    built from torch-free modules."""
    answers = {command: _probe(script, command, "--help") for command in _subcommands(script)}
    assert answers == dict.fromkeys(answers, "exit 0, torch modules: []")


@pytest.mark.parametrize("script", ["mm-train", *sorted(APPS)])
def test_a_config_that_cannot_be_read_is_refused_without_importing_torch(script, tmp_path):
    assert _probe(script, "--config", str(tmp_path / "missing.yaml")) == "exit 2, torch modules: []"
