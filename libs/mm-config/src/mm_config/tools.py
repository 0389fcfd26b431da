"""``tools``: torch profiler traces and allocator memory snapshots over a step range."""

from __future__ import annotations

from pydantic import Field, model_validator

from .base import ConfigModel
from .errors import Problem, RuleViolations


class _StepRange(ConfigModel):
    @model_validator(mode="after")
    def _range_ordered(self):  # noqa: ANN202 - shared by subclasses
        if self.enable and self.end_step <= self.start_step:
            raise RuleViolations(
                [
                    Problem(
                        ("end_step",),
                        f"must be greater than start_step ({self.start_step})",
                        self.end_step,
                        deps=(("start_step",), ("enable",)),
                    )
                ]
            )
        return self


class ProfileConfig(_StepRange):
    """``tools.profile``: a profiler trace of steps [start_step, end_step) (``torch_npu.profiler`` on NPU,
    ``torch.profiler`` otherwise)."""

    enable: bool = False
    """Record a trace."""
    start_step: int = Field(default=2, ge=0)
    """First profiled step (skip the first, warm-up steps)."""
    end_step: int = Field(default=4, ge=1)
    """Step at which profiling stops (exclusive)."""
    output_dir: str | None = None
    """Where traces go; None = ``<log_dir or save>/profile``."""
    record_shapes: bool = False
    """Record operator input shapes."""
    with_stack: bool = False
    """Record Python stacks (large traces)."""


class MemoryProfileConfig(_StepRange):
    """``tools.memory_profile``: an allocator history snapshot of steps [start_step, end_step) (CUDA / NPU;
    on CPU the profiler's allocator events: ``memory_timeline_rank<r>.json``)."""

    enable: bool = False
    """Record allocator history and dump a snapshot."""
    start_step: int = Field(default=0, ge=0)
    """Step at which recording starts."""
    end_step: int = Field(default=2, ge=1)
    """Step at which the snapshot is dumped and recording stops."""
    output_dir: str | None = None
    """Where snapshots go; None = ``<log_dir or save>/memory``."""


class ToolsConfig(ConfigModel):
    """The ``tools`` section."""

    profile: ProfileConfig = ProfileConfig()
    """Torch profiler."""
    memory_profile: MemoryProfileConfig = MemoryProfileConfig()
    """Memory snapshot."""


__all__ = ["MemoryProfileConfig", "ProfileConfig", "ToolsConfig"]
