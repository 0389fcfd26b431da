"""``mm-train plan``: one real-size training step traced on fake tensors, per-rank memory by category,
fit, step time and MFU, and the search over layouts (docs/DESIGN.md "Planning a run")."""

from mm_trainer.planner import checkpoint_staging as _checkpoint_staging  # noqa: F401 - registers its host line
from mm_trainer.planner.categories import (
    DEVICE_CATEGORIES,
    HOST_CATEGORIES,
    Category,
    Tag,
    register_host_term,
)
from mm_trainer.planner.inputs import MAX_TRACED_WORLD_SIZE, PlanInputError, check_world, plan_device
from mm_trainer.planner.report import PlanSummary, render, summarize
from mm_trainer.planner.search import Layout, SearchResult, render_search, search_layouts
from mm_trainer.planner.trace import TracedRun, trace_run

__all__ = [
    "DEVICE_CATEGORIES",
    "HOST_CATEGORIES",
    "MAX_TRACED_WORLD_SIZE",
    "Category",
    "Layout",
    "PlanInputError",
    "PlanSummary",
    "SearchResult",
    "Tag",
    "TracedRun",
    "check_world",
    "plan_device",
    "register_host_term",
    "render",
    "render_search",
    "search_layouts",
    "summarize",
    "trace_run",
]
