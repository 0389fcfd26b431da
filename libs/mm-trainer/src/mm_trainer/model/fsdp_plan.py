"""The one conversion from the ``parallel.fsdp_plan`` config section to mm-parallel's FSDP plan.

mm-config and mm-parallel import nothing of each other, so each declares the plan: the config as a
pydantic model (``FSDPPlanConfig``), the library as dataclasses (``FSDPPlan``). Both have the same
fields, defaults and accepted values (libs/mm-trainer/tests/test_fsdp_plan_parity.py checks every field); this is the
only place one becomes the other.
"""

from __future__ import annotations

from mm_config import FSDPPlanConfig
from mm_parallel import FSDPPlan


def fsdp_plan_from_config(section: FSDPPlanConfig) -> FSDPPlan:
    """The library plan of a validated ``parallel.fsdp_plan`` section (dtype names become torch dtypes)."""
    return FSDPPlan.from_dict(section.model_dump())


__all__ = ["fsdp_plan_from_config"]
