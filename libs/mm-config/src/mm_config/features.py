"""``features``: activation recompute, activation offload and batched condition encoding."""

from __future__ import annotations

from pydantic import Field

from .base import ConfigModel, ModulePattern


class ModulePlanConfig(ConfigModel):
    """A set of modules a feature wraps (applied before FSDP so it sits inside the FSDP hooks)."""

    apply_modules: list[ModulePattern] = []
    """Module path patterns (same syntax as ``parallel.fsdp_plan.apply_modules``)."""


class FeaturesConfig(ConfigModel):
    """The ``features`` section."""

    recompute_plan: ModulePlanConfig = ModulePlanConfig()
    """Activation checkpointing of the matched modules."""
    activation_offload_plan: ModulePlanConfig = ModulePlanConfig()
    """Move activations saved by the matched modules to host memory until backward."""
    condition_mbs: int = Field(default=1, ge=1)
    """Encode VAE/text conditions for this many micro-steps ahead and consume them slot by slot.

    Inside a context-parallel group (whose ranks see the same micro-batches) each rank encodes
    only every ``cp``-th micro-batch and receives the others' conditions, so the frozen encoders run
    once per micro-batch instead of once per rank. 1 = off; above 1 a multiple of ulysses x ring; needs frozen
    condition encoders (conditions carry no autograd graph across ranks)."""


__all__ = ["FeaturesConfig", "ModulePlanConfig"]
