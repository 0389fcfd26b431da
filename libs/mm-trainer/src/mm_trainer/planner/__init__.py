"""``mm-train plan``: one real-size training step traced on fake tensors, per-rank memory by category,
fit, step time and MFU, and the search over layouts (docs/DESIGN.md "Planning a run").

The names below are imported on first use: ``mm-train --help`` reads the device table
(``device_specs``) without importing torch."""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    "DEVICE_CATEGORIES": "categories",
    "HOST_CATEGORIES": "categories",
    "Category": "categories",
    "Tag": "categories",
    "register_host_term": "categories",
    "PlanSummary": "report",
    "render": "report",
    "summarize": "report",
    "Layout": "search",
    "SearchResult": "search",
    "render_search": "search",
    "search_layouts": "search",
    "TracedRun": "trace",
    "trace_run": "trace",
    "MAX_TRACED_WORLD_SIZE": "inputs",
    "PlanInputError": "inputs",
    "check_world": "inputs",
    "plan_device": "inputs",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"mm_trainer.planner.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
