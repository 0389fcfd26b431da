"""``mm-train plot RUN_DIR``: a PNG of a run's ``metrics.jsonl`` to look at instead of reading JSON.

One panel per series over the optimizer step: the loss (raw, and smoothed as TensorBoard smooths
it), the learning rate, the gradient norm, and the validation loss and reward where records carry
``val_loss`` / ``val_reward`` (``training.rewards``). Rendered with matplotlib's Agg backend (no display needed); matplotlib is the
optional extra ``mm-trainer[plot]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mm_config import MissingDependencyError
from mm_data import smooth_losses as smooth  # TensorBoard's smoothing, as the demo's contact sheet

METRICS_FILE = "metrics.jsonl"
PANELS = (
    ("loss", "loss"),
    ("lr", "learning rate"),
    ("grad_norm", "grad norm"),
    ("val_loss", "validation loss"),
    ("val_reward", "validation reward"),
)
"""``(record key, panel title)`` in panel order; a key no record holds gets no panel."""


def read_metrics(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of ``<run_dir>/metrics.jsonl`` (``run_dir`` may also be the file itself).

    A torn last line (a run killed, or still writing) is left out; any other line that is not a JSON
    object with a ``step`` is an error naming the file and line.
    """
    path = Path(run_dir)
    path = path / METRICS_FILE if path.is_dir() else path
    if not path.is_file():
        raise FileNotFoundError(
            f"{run_dir}: no {METRICS_FILE} there; RUN_DIR is the folder a run writes it to "
            "(training.log_dir, else training.save)"
        )
    lines = path.read_text().splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            if number == len(lines):
                break  # torn by a kill mid-write, or being written now
            raise ValueError(f"{path}:{number}: not JSON ({err.msg}): {line[:80]!r}") from None
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            raise ValueError(
                f"{path}:{number}: expected a JSON object with an integer 'step', got {line[:80]!r}"
            )
        records.append(record)
    if not records:
        raise ValueError(f"{path} holds no records yet: the run has not logged a step")
    return records


def series(records: Sequence[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """``(steps, values)`` of the records holding a finite number under ``key``."""
    steps, values = [], []
    for record in records:
        value = record.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            steps.append(record["step"])
            values.append(float(value))
    return steps, values


def plot_metrics(
    run_dir: str | os.PathLike, out: str | os.PathLike | None = None, *, smoothing: float = 0.9
) -> Path:
    """Write the PNG of a run's metrics to ``out`` (default ``<run_dir>/metrics.png``); return its path."""
    records = read_metrics(run_dir)
    panels = [(key, title, *series(records, key)) for key, title in PANELS]
    panels = [panel for panel in panels if panel[2]]
    if not panels or panels[0][0] != "loss":
        raise ValueError(f"{run_dir}: no finite 'loss' in {len(records)} records of {METRICS_FILE}")
    figure = _figure(len(panels))
    axes = figure.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (key, title, steps, values) in zip(axes, panels):
        raw = ax.plot(steps, values, linewidth=1, label=key)[0]
        if key == "loss":
            raw.set_alpha(0.35)
            ax.plot(steps, smooth(values, smoothing), color=raw.get_color(), label=f"smoothed ({smoothing})")
            ax.legend(loc="upper right")
        if key in ("val_loss", "val_reward"):
            raw.set_marker("o")
        ax.set_ylabel(title)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("step")
    steps = sorted({record["step"] for record in records})
    figure.suptitle(f"{Path(run_dir).resolve().name}: steps {steps[0]}-{steps[-1]}")
    path = Path(out) if out is not None else _default_out(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png", dpi=100)
    return path


def _figure(rows: int) -> Any:
    """A matplotlib figure drawn by the Agg backend (no pyplot: no GUI, no global state)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as err:
        raise MissingDependencyError(
            "mm-train plot draws with matplotlib, which is not installed: pip install 'mm-trainer[plot]'"
        ) from err
    figure = Figure(figsize=(9, 2.4 * rows + 0.6), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _default_out(run_dir: str | os.PathLike) -> Path:
    path = Path(run_dir)
    return (path if path.is_dir() else path.parent) / "metrics.png"


def build_parser(prog: str = "mm-train plot") -> argparse.ArgumentParser:
    """The ``plot`` subcommand's parser."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Write a PNG of a run's metrics.jsonl: loss (raw and smoothed), learning rate, grad norm "
        "and validation loss over the optimizer steps. Needs matplotlib (pip install 'mm-trainer[plot]').",
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="folder holding metrics.jsonl (the run's "
                        "training.log_dir, else training.save), or the file itself")  # fmt: skip
    parser.add_argument("--out", default=None, help="PNG to write (default: RUN_DIR/metrics.png)")
    parser.add_argument(
        "--smoothing", type=float, default=0.9, help="weight on the past of the smoothed loss, in [0, 1)"
    )
    return parser


def main(argv: Sequence[str] | None = None, *, prog: str = "mm-train plot") -> int:
    """The ``plot`` subcommand: 0 with the PNG written (its path printed), 2 on a bad run dir or file."""
    args = build_parser(prog).parse_args(argv)
    try:
        path = plot_metrics(args.run_dir, args.out, smoothing=args.smoothing)
    except (OSError, ValueError, ImportError) as err:
        print(f"plot: {err}", file=sys.stderr)
        return 2
    print(path)
    return 0
