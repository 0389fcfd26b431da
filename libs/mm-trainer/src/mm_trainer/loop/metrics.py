"""Training metrics: a progress bar on rank 0, a JSONL file, and optional trackers (TensorBoard, Weights &
Biases: :mod:`mm_trainer.loop.trackers`)."""

from __future__ import annotations

import datetime
import json
import os
import resource
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from mm_trainer.loop.trackers import Tracker, open_trackers
from mm_trainer.planner.device_specs import peak_flops_by_device_name

#: Dense bf16 peak FLOP/s by device-name substring, used for MFU when the model reports FLOPs per
#: sample: the device table of ``mm-train plan`` (:mod:`mm_trainer.planner.device_specs`).
PEAK_FLOPS: dict[str, float] = peak_flops_by_device_name()


def device_peak_flops(device_type: str, override: float | None = None) -> float | None:
    """Peak FLOP/s of the current device from :data:`PEAK_FLOPS` (None when unknown, e.g. CPU)."""
    if override:
        return override
    name = ""
    if device_type == "cuda" and torch.cuda.is_available():
        name = torch.cuda.get_device_name()
    elif device_type == "npu":
        npu = getattr(torch, "npu", None)
        name = npu.get_device_name() if npu is not None else ""
    for key, flops in PEAK_FLOPS.items():
        if key.lower() in name.lower():
            return flops
    return None


def peak_memory_bytes(device_type: str) -> int:
    """Peak allocated accelerator memory, or the process's peak RSS on CPU."""
    if device_type == "cuda" and torch.cuda.is_available():
        return int(torch.cuda.max_memory_allocated())
    npu = getattr(torch, "npu", None)
    if device_type == "npu" and npu is not None:
        return int(npu.max_memory_allocated())
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def format_log_line(step: int, total_steps: int, record: Mapping[str, Any], eta_s: float | None) -> str:
    """One plain console line for a log step: step, loss, lr, grad norm, step time, samples/s, ETA.

    Written instead of a progress bar when stderr is no terminal (a log file, a pipe), where tqdm's
    redraws would bury the numbers.
    """
    nan = float("nan")
    eta = "?" if eta_s is None else str(datetime.timedelta(seconds=round(eta_s)))
    return (
        f"step {step}/{total_steps} | loss {record.get('loss', nan):.4g} | lr {record.get('lr', nan):.3e} | "
        f"grad_norm {record.get('grad_norm', nan):.4g} | step_time {record.get('step_time_s', nan):.3f}s | "
        f"samples/s {record.get('samples_per_s', nan):.3g} | eta {eta}"
    )


class MetricsLogger:
    """Writes one record per log step to console, JSONL and the trackers (TensorBoard, W&B).

    The console gets a progress bar on a terminal, else one :func:`format_log_line` per log step.
    Only rank 0 writes; other ranks hold a disabled logger so that call sites stay simple. A run that
    starts at ``start_step`` (a resume) first drops the records of later steps from ``metrics.jsonl``
    (and purges them from TensorBoard): the run writes them again, and readers see each step once.
    TensorBoard events go to ``<log_dir>/tensorboard`` when ``tensorboard`` is true, or None with the
    package installed (:func:`mm_trainer.run.summary.tensorboard_enabled`); ``wandb`` (the
    ``training.wandb`` section) logs the same numbers and the validation clips to a W&B run, with the run's
    ``config`` (:class:`mm_trainer.loop.trackers.WandbTracker`).
    """

    def __init__(
        self,
        *,
        total_steps: int,
        start_step: int = 0,
        log_dir: str | os.PathLike | None = None,
        tensorboard: bool | None = None,
        wandb: Any = None,
        config: Mapping[str, Any] | None = None,
        enabled: bool = True,
    ) -> None:
        self.enabled = enabled
        self._jsonl = None
        self._trackers: list[Tracker] = []
        self._bar = None
        if not enabled:
            return
        if log_dir is not None:
            Path(log_dir).mkdir(parents=True, exist_ok=True)
            # the trackers come first: a refused run (a missing package) leaves no open metrics file behind
            self._trackers = open_trackers(log_dir=Path(log_dir), start_step=start_step, tensorboard=tensorboard,
                                           wandb=wandb, config=config)  # fmt: skip
            path = Path(log_dir) / "metrics.jsonl"
            _drop_records_after(path, start_step)
            self._jsonl = open(path, "a", buffering=1)  # noqa: SIM115
        elif wandb is not None:
            raise ValueError(
                "training.wandb needs training.log_dir or save (its local files and run id go there)"
            )
        self.total_steps, self._start = total_steps, (start_step, time.monotonic())
        if not _is_terminal(sys.stderr):
            return  # plain lines from log()
        self._bar = tqdm(
            total=total_steps,
            initial=start_step,
            desc="train",
            unit="step",
            dynamic_ncols=True,
            file=sys.stderr,
        )

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """Record ``metrics`` for optimizer step ``step`` (1-based)."""
        if not self.enabled:
            return
        record = {"step": step, **{k: _plain(v) for k, v in metrics.items()}}
        if self._jsonl is not None:
            self._jsonl.write(json.dumps(record) + "\n")
        scalars = {k: v for k, v in record.items() if k != "step" and isinstance(v, (int, float))}
        for tracker in self._trackers:
            tracker.log_scalars(step, scalars)
        if self._bar is not None:
            self._bar.set_postfix(
                loss=f"{record.get('loss', float('nan')):.4g}", lr=f"{record.get('lr', 0):.2e}", refresh=False
            )
        else:
            print(
                format_log_line(step, self.total_steps, record, self._eta(step)), file=sys.stderr, flush=True
            )

    def add_video(
        self, tag: str, video: torch.Tensor, step: int, path: str | os.PathLike | None = None
    ) -> None:
        """Log a clip ``[3, F, H, W]`` in ``[-1, 1]`` to the trackers: TensorBoard as its frames (an image
        strip), W&B as the mp4 ``path`` it was written to (None: not written, not logged there)."""
        for tracker in self._trackers:
            tracker.log_video(tag, video, step, Path(path) if path is not None else None)

    def add_audio(
        self,
        tag: str,
        waveform: torch.Tensor,
        sample_rate: int,
        step: int,
        path: str | os.PathLike | None = None,
    ) -> None:
        """Log a waveform ``[channels, N]`` in ``[-1, 1]`` to the trackers (W&B: the WAV file ``path``)."""
        for tracker in self._trackers:
            tracker.log_audio(tag, waveform, sample_rate, step, Path(path) if path is not None else None)

    def _eta(self, step: int) -> float | None:
        """Seconds left at the mean step time since this logger started (None before the first step)."""
        start_step, started = self._start
        done = step - start_step
        return (time.monotonic() - started) / done * max(self.total_steps - step, 0) if done > 0 else None

    def advance(self, n: int = 1) -> None:
        """Move the progress bar by ``n`` steps."""
        if self._bar is not None:
            self._bar.update(n)

    def write(self, message: str) -> None:
        """Print a line without breaking the progress bar (rank 0 only)."""
        if not self.enabled:
            return
        if self._bar is not None:
            tqdm.write(message, file=sys.stderr)
        else:
            print(message, file=sys.stderr, flush=True)

    def close(self, failed: bool = False) -> None:
        """Close the progress bar, ``metrics.jsonl`` and the trackers (``failed``: the run ends with an error,
        which W&B records as the run's exit code)."""
        for handle in (self._bar, self._jsonl):
            if handle is not None:
                handle.close()
        trackers, self._trackers = self._trackers, []
        for tracker in trackers:
            tracker.close(failed)


def _is_terminal(stream: Any) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def _drop_records_after(path: Path, step: int) -> None:
    """Keep only the records of steps ``<= step`` in ``path`` (atomically); a line torn by a kill
    mid-write is dropped too."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and int(record.get("step", 0)) <= step:
            kept.append(line + "\n")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(kept))
    os.replace(tmp, path)


def _plain(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.item()
    return value
