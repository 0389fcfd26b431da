"""How long each console script takes to answer ``--help`` (not a test; prints a table).

Each script's entry point (``[project.scripts]`` of its pyproject.toml) runs with ``--help`` in a fresh
interpreter, as its console script does; the reference is ``python -c pass`` in the same run. Wall-clock
seconds, the median of ``--repeats`` runs, and whether torch was imported by the time it exited.

Usage: python benchmarks/cli_start.py [--repeats 3] [--scripts wan22-train mm-train]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[1]

PROBE = """
import atexit, sys
atexit.register(lambda: sys.__stderr__.write("\\ntorch imported: %s\\n" % ("torch" in sys.modules)))
sys.argv = [{name!r}, "--help"]
from {module} import {function}
{function}()
"""
"""A console script's stub, plus a line saying whether torch was imported when it exited."""


def console_scripts() -> dict[str, str]:
    """Every console script of the libraries and apps: name -> ``module:function``."""
    scripts = {}
    for pyproject in sorted([*REPO.glob("libs/*/pyproject.toml"), *REPO.glob("apps/*/pyproject.toml")]):
        scripts.update(tomllib.loads(pyproject.read_text())["project"].get("scripts", {}))
    return scripts


def timed(code: str) -> tuple[float, str]:
    """Wall-clock seconds of ``python -c code`` and its stderr."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{code!r} exited {done.returncode}:\n{done.stderr[-2000:]}")
    return seconds, done.stderr


def measure(name: str, target: str, repeats: int) -> tuple[float, bool]:
    """Median seconds of ``name --help`` and whether it imported torch."""
    module, function = target.split(":")
    code = PROBE.format(name=name, module=module, function=function)
    runs = [timed(code) for _ in range(repeats)]
    return statistics.median(s for s, _ in runs), "torch imported: True" in runs[-1][1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs per script (the median is shown)")
    parser.add_argument("--scripts", nargs="*", help="only these console scripts (default: all)")
    args = parser.parse_args(argv)
    scripts = console_scripts()
    chosen = {name: scripts[name] for name in (args.scripts or scripts)}
    reference = statistics.median(timed("pass")[0] for _ in range(args.repeats))
    print(f"{'command':<24} {'seconds':>8} {'x python -c pass':>17}  torch imported")
    print(f"{'python -c pass':<24} {reference:8.2f} {1.0:17.1f}  False")
    for name, target in chosen.items():
        seconds, torch = measure(name, target, args.repeats)
        print(f"{name + ' --help':<24} {seconds:8.2f} {seconds / reference:17.1f}  {torch}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
