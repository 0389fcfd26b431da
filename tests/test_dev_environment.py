"""The environment the tests run in holds every member as its checkout declares it (`hatch run sync`)."""

from __future__ import annotations

from importlib.metadata import distribution
from pathlib import Path

import pytest
import tomllib

REPO = Path(__file__).resolve().parents[1]
MEMBERS = sorted([*REPO.glob("libs/*/pyproject.toml"), *REPO.glob("apps/*/pyproject.toml")])


def _declared(pyproject: Path) -> set[tuple[str, str, str]]:
    project = tomllib.loads(pyproject.read_text())["project"]
    groups = {"console_scripts": project.get("scripts", {}), **project.get("entry-points", {})}
    return {(group, name, value) for group, table in groups.items() for name, value in table.items()}


@pytest.mark.parametrize("pyproject", MEMBERS, ids=[p.parent.name for p in MEMBERS])
def test_installed_member_advertises_the_entry_points_its_pyproject_declares(pyproject: Path):
    name = tomllib.loads(pyproject.read_text())["project"]["name"]
    installed = {(ep.group, ep.name, ep.value) for ep in distribution(name).entry_points}
    assert installed == _declared(pyproject), (
        f"{name} is installed with stale metadata (entry points differ from {pyproject}); "
        "run `hatch run sync` to re-install the workspace members"
    )


def test_the_test_command_ends_with_the_slowest_tests_and_their_times():
    """`hatch run test` (CI's command) prints the durations table: a test past 120 s is a benchmark in
    disguise, and the table shows it."""
    scripts = tomllib.loads((REPO / "hatch.toml").read_text())["envs"]["default"]["scripts"]
    assert "--durations=20" in " ".join(scripts["test"])
