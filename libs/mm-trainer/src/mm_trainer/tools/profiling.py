"""``tools.profile`` (a profiler trace of a step range) and ``tools.memory_profile`` (an allocator
snapshot of a step range), each with the tool of the device in use.

Traces (:class:`StepProfiler`, ``trace_rank<r>.json``, a Chrome / Perfetto trace):

- ``npu``: ``torch_npu.profiler.profile`` with the CPU and NPU activities (torch's own profiler sees no
  NPU kernels);
- ``cuda``: ``torch.profiler.profile`` with the CPU and CUDA activities;
- ``cpu``: ``torch.profiler.profile`` with the CPU activity.

Memory (:class:`MemoryProfiler`; every device also writes ``memory_rank<r>.json``, the peak RSS per step):

- ``cuda`` / ``npu``: the caching allocator's history (``torch.cuda.memory`` /
  ``torch_npu.npu.memory``: ``_record_memory_history`` at the first step, ``_dump_snapshot`` after the
  last) as ``memory_snapshot_rank<r>.pickle``, for pytorch.org/memory_viz;
- ``cpu``: torch keeps no allocator history on CPU. What it offers is the profiler's memory events
  (``profile_memory=True``: one ``[memory]`` event per allocation and free of the CPU allocator, with
  its bytes and the total allocated after it), recorded over the step range and written as
  ``memory_trace_rank<r>.json`` (the Chrome trace holding them) and ``memory_timeline_rank<r>.json``
  (those events in time order and the peak of the total allocated). It counts torch's tensor
  allocations only, not other host memory.

The pinned signatures of the torch_npu calls are test data (``libs/mm-trainer/tests/npu_api.py``).
"""

from __future__ import annotations

import json
import resource
from pathlib import Path
from typing import Any

import torch

__all__ = ["MemoryProfiler", "StepProfiler"]


def _trace_profiler(device_type: str, **options: Any) -> Any:
    """A (not yet started) profiler of the device's kind."""
    if device_type == "npu":
        import torch_npu

        npu = torch_npu.profiler
        activities = [npu.ProfilerActivity.CPU, npu.ProfilerActivity.NPU]
        return npu.profile(activities=activities, **options)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device_type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return torch.profiler.profile(activities=activities, **options)


def _allocator_memory(device_type: str) -> Any:
    """The ``memory`` module with ``_record_memory_history`` / ``_dump_snapshot`` of an accelerator."""
    if device_type == "npu":
        import torch_npu

        return torch_npu.npu.memory
    return torch.cuda.memory


class _StepRangeTool:
    """What both tools take: the step range ``[start_step, end_step)``, where files go, the rank, the device."""

    def __init__(
        self,
        *,
        enable: bool,
        start_step: int,
        end_step: int,
        output_dir: str,
        rank: int,
        device_type: str = "cpu",
    ) -> None:
        self.enable, self.start, self.end = enable, start_step, end_step
        self.output_dir, self.rank, self.device_type = Path(output_dir), rank, device_type


class StepProfiler(_StepRangeTool):
    """A trace of the optimizer steps in ``[start_step, end_step)`` on ``device_type`` (see the module
    docstring)."""

    def __init__(self, *, record_shapes: bool = False, with_stack: bool = False, **step_range: Any) -> None:
        super().__init__(**step_range)
        self.record_shapes, self.with_stack = record_shapes, with_stack
        self._prof: Any = None

    @property
    def path(self) -> Path:
        """Where the trace goes."""
        return self.output_dir / f"trace_rank{self.rank}.json"

    def step_begin(self, step: int) -> None:
        if self.enable and step == self.start and self._prof is None:
            self._prof = _trace_profiler(
                self.device_type, record_shapes=self.record_shapes, with_stack=self.with_stack
            )
            self._prof.__enter__()

    def step_end(self, step: int) -> None:
        if self._prof is not None and step + 1 >= self.end:
            self._prof.__exit__(None, None, None)
            self.output_dir.mkdir(parents=True, exist_ok=True)
            self._prof.export_chrome_trace(str(self.path))
            self._prof = None


class MemoryProfiler(_StepRangeTool):
    """An allocator snapshot of the steps in ``[start_step, end_step)`` on ``device_type`` (see the module
    docstring), and the peak RSS of each of those steps."""

    def __init__(self, **step_range: Any) -> None:
        super().__init__(**step_range)
        self._records: list[dict] = []
        self._cpu_prof: Any = None

    def step_begin(self, step: int) -> None:
        if not (self.enable and step == self.start):
            return
        if self.device_type == "cpu":
            self._cpu_prof = torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
            )
            self._cpu_prof.__enter__()
        else:
            _allocator_memory(self.device_type)._record_memory_history()

    def step_end(self, step: int) -> None:
        if not self.enable or not (self.start <= step < self.end):
            return
        self._records.append(
            {"step": step, "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
        )
        if step + 1 < self.end:
            return
        self.output_dir.mkdir(parents=True, exist_ok=True)
        if self.device_type == "cpu":
            self._write_cpu_memory()
        else:
            memory = _allocator_memory(self.device_type)
            memory._dump_snapshot(str(self.output_dir / f"memory_snapshot_rank{self.rank}.pickle"))
            memory._record_memory_history(enabled=None)
        (self.output_dir / f"memory_rank{self.rank}.json").write_text(json.dumps(self._records, indent=1))

    def _write_cpu_memory(self) -> None:
        """The profiler's CPU allocator events: the trace, and the timeline with its peak."""
        self._cpu_prof.__exit__(None, None, None)
        trace = self.output_dir / f"memory_trace_rank{self.rank}.json"
        self._cpu_prof.export_chrome_trace(str(trace))
        self._cpu_prof = None
        events = sorted(
            (e for e in json.loads(trace.read_text())["traceEvents"] if e.get("name") == "[memory]"),
            key=lambda e: e["ts"],
        )
        timeline = [
            {"ts_us": e["ts"], "bytes": e["args"]["Bytes"], "total_allocated": e["args"]["Total Allocated"]}
            for e in events
        ]
        peak = max((t["total_allocated"] for t in timeline), default=0)
        summary = {"device": "cpu", "source": "torch.profiler profile_memory", "peak_allocated_bytes": peak,
                   "events": timeline}  # fmt: skip
        (self.output_dir / f"memory_timeline_rank{self.rank}.json").write_text(json.dumps(summary, indent=1))
