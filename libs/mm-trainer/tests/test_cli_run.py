"""mm_trainer.cli.run: an exception ends the process at once, printed with the rank on every line."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

FAILING_ENTRY = """
from mm_trainer.cli import run

def main():
    raise FileNotFoundError(2, "No such file or directory", "/data/missing.json")

run(main)
"""


def test_an_exception_ends_the_process_with_code_1_and_prints_it_with_its_rank():
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC_")}
    proc = subprocess.run(
        [sys.executable, "-c", FAILING_ENTRY],
        env={**env, "RANK": "3"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    assert lines[0] == "[rank 3] Traceback (most recent call last):"
    assert all(line.startswith("[rank 3] ") for line in lines)
    assert lines[-1] == (
        f"[rank 3] failed on rank 3 ({socket.gethostname()}): FileNotFoundError: "
        "[Errno 2] No such file or directory: '/data/missing.json'"
    )
