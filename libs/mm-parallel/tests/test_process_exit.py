"""exit_process: a training process leaves after its atexit handlers, without interpreter teardown."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tomllib

REPO = Path(__file__).resolve().parents[3]

LEAVER = textwrap.dedent(
    """
    import atexit, sys
    from mm_parallel import exit_process

    class Teardown:
        def __del__(self):
            print("teardown ran", flush=True)

    KEPT = Teardown()  # a module global: only interpreter teardown would finalize it
    atexit.register(lambda: print("atexit ran"))
    sys.stdout.write("buffered, no newline")
    exit_process(3)
    print("after exit_process")
    """
)


def _leave() -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", LEAVER], capture_output=True, text=True, timeout=300)


def test_exit_process_ends_with_the_given_code():
    assert _leave().returncode == 3


def test_exit_process_runs_atexit_handlers_and_flushes_stdout():
    out = _leave().stdout
    assert out.startswith("buffered, no newline")
    assert "atexit ran" in out


def test_exit_process_skips_interpreter_teardown():
    out = _leave().stdout
    assert "teardown ran" not in out
    assert "after exit_process" not in out


@pytest.mark.parametrize(
    ("member", "script"),
    [("libs/mm-trainer", "mm-train"), ("apps/wan22-train", "wan22-train"), ("apps/ltx2-train", "ltx2-train")],
)
def test_training_console_scripts_leave_through_exit_process(member: str, script: str):
    target = tomllib.loads((REPO / member / "pyproject.toml").read_text())["project"]["scripts"][script]
    module = target.split(":")[0]
    assert target.endswith(":run"), (
        f"{script} -> {target}: training entry points must end through exit_process"
    )
    main_module = REPO / member / "src" / module.split(".")[0] / "__main__.py"
    assert f"from {module} import run" in main_module.read_text()
