"""Training metrics: a progress bar on rank 0, a JSONL file, and optional TensorBoard."""

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
from mm_config import MissingDependencyError
from tqdm import tqdm

from mm_trainer.planner.device_specs import peak_flops_by_device_name
from mm_trainer.run.summary import tensorboard_enabled

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


def _summary_writer_class(setting: bool | None) -> type:
    """torch's ``SummaryWriter``; a clear error naming the extra when tensorboard is missing."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise MissingDependencyError(
            f"training.tensorboard is {'on' if setting else 'unset (on when installed)'} but "
            f"torch.utils.tensorboard cannot import tensorboard ({exc}): pip install "
            "'mm-trainer[tensorboard]', or set training.tensorboard: false"
        ) from exc
    return SummaryWriter


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
    """Writes one record per log step to console, JSONL and TensorBoard.

    The console gets a progress bar on a terminal, else one :func:`format_log_line` per log step.
    Only rank 0 writes; other ranks hold a disabled logger so that call sites stay simple. A run that
    starts at ``start_step`` (a resume) first drops the records of later steps from ``metrics.jsonl``
    (and purges them from TensorBoard): the run writes them again, and readers see each step once.
    TensorBoard events go to ``<log_dir>/tensorboard`` when ``tensorboard`` is true, or None with the
    package installed (:func:`tensorboard_enabled`).
    """

    def __init__(
        self,
        *,
        total_steps: int,
        start_step: int = 0,
        log_dir: str | os.PathLike | None = None,
        tensorboard: bool | None = None,
        enabled: bool = True,
    ) -> None:
        self.enabled = enabled
        self._jsonl = None
        self._tb = None
        self._bar = None
        if not enabled:
            return
        if log_dir is not None:
            # the TensorBoard check comes first: a refused run leaves no open metrics file behind
            writer = _summary_writer_class(tensorboard) if tensorboard_enabled(tensorboard) else None
            Path(log_dir).mkdir(parents=True, exist_ok=True)
            path = Path(log_dir) / "metrics.jsonl"
            _drop_records_after(path, start_step)
            self._jsonl = open(path, "a", buffering=1)  # noqa: SIM115
            if writer is not None:
                self._tb = writer(log_dir=str(Path(log_dir) / "tensorboard"), purge_step=start_step + 1)
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
        if self._tb is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)):
                    self._tb.add_scalar(f"train/{key}", value, step)
        if self._bar is not None:
            self._bar.set_postfix(
                loss=f"{record.get('loss', float('nan')):.4g}", lr=f"{record.get('lr', 0):.2e}", refresh=False
            )
        else:
            print(
                format_log_line(step, self.total_steps, record, self._eta(step)), file=sys.stderr, flush=True
            )

    def add_video(self, tag: str, video: torch.Tensor, step: int) -> None:
        """Log a clip ``[3, F, H, W]`` in ``[-1, 1]`` to TensorBoard (when on) as its frames, an image
        strip (``add_video`` would need moviepy)."""
        if self._tb is None:
            return
        frames = ((video.detach().float().cpu().transpose(0, 1) + 1) / 2).clamp(0, 1)  # [F, 3, H, W]
        self._tb.add_images(tag, frames, step)

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

    def close(self) -> None:
        for handle in (self._bar, self._jsonl, self._tb):
            if handle is not None:
                handle.close()


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
