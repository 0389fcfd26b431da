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
    """Encode VAE/text conditions for this many micro-steps at once and consume them slot by slot."""


__all__ = ["FeaturesConfig", "ModulePlanConfig"]
