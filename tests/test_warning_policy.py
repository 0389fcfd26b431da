"""Warnings are errors in the test suite, except the allowlist of :mod:`mm_config.warning_policy`."""

from __future__ import annotations

import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from mm_config import AllowedWarning, install_warning_filters, warning_policy

REPO = Path(__file__).resolve().parents[1]

PLANTED = """
import subprocess
import sys
import warnings

# what `warnings.warn("...", stacklevel=1)` inside mm_trainer.trainer would raise
WARN = 'warnings.warn_explicit("planted warning", UserWarning, "trainer.py", 1, module="mm_trainer.trainer")'


def test_calls_a_project_module_that_warns():
    exec(WARN)


def test_a_forked_rank_calls_a_project_module_that_warns(distributed):
    distributed(lambda rank, world_size: exec(WARN), 1)


def test_a_started_process_calls_a_project_module_that_warns():
    proc = subprocess.run([sys.executable, "-c", "import warnings; " + WARN], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
"""


def run_suite_over(tmp_path: Path, test_text: str) -> subprocess.CompletedProcess:
    """pytest under the repository's configuration (pyproject.toml, root conftest.py) over one test file."""
    shutil.copy(REPO / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_planted.py").write_text(test_text)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-c", str(REPO / "pyproject.toml"), "--rootdir", str(tmp_path),
         "-p", "no:cacheprovider", str(tmp_path / "test_planted.py")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.mark.slow
def test_a_warning_planted_in_a_project_module_fails_the_suite_in_the_test_a_forked_rank_or_a_started_process(
    tmp_path,
):
    result = run_suite_over(tmp_path, PLANTED)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.count("UserWarning: planted warning") >= 3, result.stdout  # one per process kind
    assert "3 failed" in result.stdout


def test_the_console_filters_ignore_an_allowed_warning_and_keep_every_other(monkeypatch):
    allowed = AllowedWarning("an upstream notice", FutureWarning, "upstream_lib", "reason: upstream 1.2")
    monkeypatch.setattr(warning_policy, "ALLOWED_WARNINGS", (allowed,))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        install_warning_filters()
        warnings.warn_explicit(
            "an upstream notice (details)", FutureWarning, "u.py", 1, module="upstream_lib.x"
        )
        with pytest.raises(FutureWarning):
            warnings.warn_explicit(
                "an upstream notice", FutureWarning, "t.py", 1, module="mm_trainer.trainer"
            )
    assert warning_policy.pytest_filter_lines() == [
        "ignore:an upstream notice:builtins.FutureWarning:upstream_lib"
    ]
