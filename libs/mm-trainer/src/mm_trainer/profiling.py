"""``tools.profile`` (torch profiler trace for a step range) and ``tools.memory_profile``."""

from __future__ import annotations

import json
import resource
from pathlib import Path
from typing import Any

import torch


class StepProfiler:
    """Collects a torch.profiler trace for optimizer steps in ``[start_step, end_step)``."""

    def __init__(
        self,
        *,
        enable: bool,
        start_step: int,
        end_step: int,
        output_dir: str,
        rank: int,
        record_shapes: bool = False,
        with_stack: bool = False,
    ) -> None:
        self.enable, self.start, self.end = enable, start_step, end_step
        self.output_dir, self.rank = Path(output_dir), rank
        self.record_shapes, self.with_stack = record_shapes, with_stack
        self._prof: Any = None

    def step_begin(self, step: int) -> None:
        if self.enable and step == self.start and self._prof is None:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self._prof = torch.profiler.profile(
                activities=activities, record_shapes=self.record_shapes, with_stack=self.with_stack
            )
            self._prof.__enter__()

    def step_end(self, step: int) -> None:
        if self._prof is not None and step + 1 >= self.end:
            self._prof.__exit__(None, None, None)
            self.output_dir.mkdir(parents=True, exist_ok=True)
            self._prof.export_chrome_trace(str(self.output_dir / f"trace_rank{self.rank}.json"))
            self._prof = None


class MemoryProfiler:
    """Allocator snapshot on CUDA for steps in ``[start_step, end_step)``; peak RSS records on CPU."""

    def __init__(self, *, enable: bool, start_step: int, end_step: int, output_dir: str, rank: int) -> None:
        self.enable, self.start, self.end = enable, start_step, end_step
        self.output_dir, self.rank = Path(output_dir), rank
        self._cuda = torch.cuda.is_available()
        self._records: list[dict] = []

    def step_begin(self, step: int) -> None:
        if self.enable and step == self.start and self._cuda:
            torch.cuda.memory._record_memory_history()

    def step_end(self, step: int) -> None:
        if not self.enable or not (self.start <= step < self.end):
            return
        self._records.append(
            {"step": step, "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
        )
        if step + 1 < self.end:
            return
        self.output_dir.mkdir(parents=True, exist_ok=True)
        if self._cuda:
            torch.cuda.memory._dump_snapshot(str(self.output_dir / f"memory_snapshot_rank{self.rank}.pickle"))
            torch.cuda.memory._record_memory_history(enabled=None)
        (self.output_dir / f"memory_rank{self.rank}.json").write_text(json.dumps(self._records, indent=1))
