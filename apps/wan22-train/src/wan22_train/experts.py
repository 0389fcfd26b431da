"""Wan2.2 A14B's two experts on the flow-match grid: the boundary between them and the grid it was set on.

The A14B model is two predictors of one shape: the high-noise expert denoises large timesteps, the
low-noise expert the rest. The split is a fraction ``b`` of the training grid: the high-noise expert
trains on grid indices ``[0, i_b)`` (large t), the low-noise one on ``[i_b, N)``, where
``i_b = mm_pipelines.boundary_index(b, N)`` is the one boundary -> index map of the scheduler's own
training range, so one-expert runs, ``expert: both`` routing and sampling all cut at the same index.
The published boundaries (0.417 t2v, 0.358 i2v) hold on the published recipe grid (shift 5,
sigma_min 0, extra_one_step), where they are the timesteps 875 and 900.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mm_pipelines import FlowMatchScheduler, boundary_index

from wan22_train.config_schema import EXPERTS, SCHEDULER_KEYS

#: The A14B expert split as a fraction of the grid, per task.
EXPERT_BOUNDARIES: dict[str, float] = {"t2v": 0.417, "i2v": 0.358}
#: The published Wan2.2 training grid the boundaries were chosen for (t >= 875 / 900).
WAN22_RECIPE_GRID: dict[str, float | bool] = {"shift": 5.0, "sigma_min": 0.0, "extra_one_step": True}


def expert_boundary(task: str, boundary: float | None = None) -> float:
    """The A14B split as a fraction of the grid: ``boundary`` if given, else the task's published one
    (``i2v`` has its own; ``t2v`` and ``ti2v`` take the t2v split)."""
    return boundary if boundary is not None else EXPERT_BOUNDARIES["i2v" if task == "i2v" else "t2v"]


def expert_scheduler(
    expert: str, task: str = "t2v", boundary: float | None = None, **grid: Any
) -> FlowMatchScheduler:
    """The training scheduler of ``model.pipeline.expert``.

    ``all``: the scheduler's defaults over the whole grid (TI2V-5B, or any one-model run);
    ``both``: the recipe grid over the whole range (the step's index picks the expert);
    ``high_noise`` / ``low_noise``: the recipe grid over that expert's side of the boundary.
    ``grid`` (scheduler keys such as ``shift``) overrides the recipe; the boundaries are the expert's.
    """
    if expert not in EXPERTS:
        raise ValueError(f"model.pipeline.expert={expert!r}: expected one of {list(EXPERTS)}")
    for key in ("min_boundary", "max_boundary"):
        if key in grid:
            raise ValueError(f"model.pipeline: {key} is set by the expert; got {key}={grid[key]!r}")
    if expert == "all":
        return FlowMatchScheduler(**grid)
    grid = {**WAN22_RECIPE_GRID, **grid}
    if expert == "both":
        return FlowMatchScheduler(**grid)
    b = expert_boundary(task, boundary)
    lo, hi = (0.0, b) if expert == "high_noise" else (b, 1.0)
    return FlowMatchScheduler(**grid, min_boundary=lo, max_boundary=hi)


def handover_index(scheduler: FlowMatchScheduler, task: str, boundary: float | None = None) -> int:
    """The grid index where the low-noise expert takes over (indices below it are high-noise)."""
    return boundary_index(expert_boundary(task, boundary), scheduler.num_train_timesteps)


def handover_timestep(
    scheduler: FlowMatchScheduler, expert: str, task: str, boundary: float | None = None
) -> float:
    """The timestep where the low-noise expert takes over: it denoises every ``t`` below this one.

    ``expert`` is ``model.pipeline.expert``; ``all`` trains one model and has no boundary (refused).
    """
    if expert == "all":
        raise ValueError("model.pipeline.expert='all' trains one model: there is no expert boundary")
    return float(scheduler.timesteps[handover_index(scheduler, task, boundary)])


def boundary_timestep(options: Mapping[str, Any]) -> float:
    """:func:`handover_timestep` of ``model.pipeline`` ``options`` (task, expert, boundary and the
    scheduler keys), for sampling with two experts: the scheduler is built, no pipeline."""
    expert, task, boundary = options.get("expert", "all"), options.get("task", "t2v"), options.get("boundary")
    grid = {key: options[key] for key in SCHEDULER_KEYS if key in options}
    return handover_timestep(expert_scheduler(expert, task, boundary, **grid), expert, task, boundary)


__all__ = [
    "EXPERT_BOUNDARIES",
    "WAN22_RECIPE_GRID",
    "boundary_timestep",
    "expert_boundary",
    "expert_scheduler",
    "handover_index",
    "handover_timestep",
]
