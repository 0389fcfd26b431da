"""``features``: activation recompute, torch.compile, activation offload and batched condition encoding."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from .base import ConfigModel, ModulePattern
from .errors import Problem, RuleViolations


class ModulePlanConfig(ConfigModel):
    """A set of modules a feature wraps (applied before FSDP so it sits inside the FSDP hooks)."""

    apply_modules: list[ModulePattern] = []
    """Module path patterns (same syntax as ``parallel.fsdp_plan.apply_modules``)."""


class RecomputePlanConfig(ModulePlanConfig):
    """Activation checkpointing: what the matched modules keep for backward, and which of them."""

    policy: Literal["full", "selective"] = "full"
    """``full``: keep only the module's inputs and run its whole forward again in backward.
    ``selective``: keep the outputs of matrix multiplications and attention, recompute everything
    else (norms, activations, modulation, RoPE, residuals) in backward
    (``torch.utils.checkpoint.create_selective_checkpoint_contexts``)."""
    every: int = Field(default=1, ge=1)
    """Recompute every k-th matched module in module order, starting with the first (1 = all); the
    others keep their activations."""

    @model_validator(mode="after")
    def _options_need_modules(self) -> RecomputePlanConfig:
        _refuse_options_without_modules(self, {"policy": "full", "every": 1}, "recomputes")
        return self


CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]


class CompilePlanConfig(ModulePlanConfig):
    """Regional ``torch.compile``: each matched module's forward compiled on its own, before FSDP
    wrapping; a recomputed module checkpoints its compiled forward. Ulysses attention compiles with the
    block; ring attention calls stay eager (a deliberate graph break), and so do the attentions of a packed
    forward (``data.packing``: a new mix of samples then compiles nothing)."""

    backend: str = "inductor"
    """``torch.compile`` backend: a name registered with ``torch._dynamo`` (``inductor``,
    ``aot_eager``, ...); checked against the device when the trainer builds the model."""
    mode: CompileMode = "default"
    """``torch.compile`` mode (``reduce-overhead`` uses CUDA graphs; ``max-autotune`` searches kernels)."""

    @model_validator(mode="after")
    def _options_need_modules(self) -> CompilePlanConfig:
        _refuse_options_without_modules(self, {"backend": "inductor", "mode": "default"}, "compiles")
        return self


def _refuse_options_without_modules(plan: ModulePlanConfig, defaults: dict[str, object], verb: str) -> None:
    """An option of a plan that matches no module acts on nothing: refused (a default value is no choice)."""
    if plan.apply_modules:
        return
    problems = [
        Problem(
            (key,),
            f"the plan {verb} nothing: apply_modules is empty (name the modules, e.g. `predictor.blocks.{{*}}`, "
            "or leave this key out)",
            getattr(plan, key),
            deps=(("apply_modules",),),
        )
        for key, default in defaults.items()
        if getattr(plan, key) != default
    ]
    if problems:
        raise RuleViolations(problems)


class FeaturesConfig(ConfigModel):
    """The ``features`` section."""

    recompute_plan: RecomputePlanConfig = RecomputePlanConfig()
    """Activation checkpointing of the matched modules (``policy``: full or selective; ``every``)."""
    compile: CompilePlanConfig = CompilePlanConfig()
    """``torch.compile`` of the matched modules (regional compilation, e.g. ``predictor.blocks.{*}``)."""
    activation_offload_plan: ModulePlanConfig = ModulePlanConfig()
    """Move activations saved by the matched modules to host memory until backward."""
    condition_micro_steps: int = Field(default=1, ge=1)
    """Encode VAE/text conditions for this many micro-steps ahead and consume them slot by slot.

    Inside a context-parallel group (whose ranks see the same micro-batches) each rank encodes
    only every ``cp``-th micro-batch and receives the others' conditions, so the frozen encoders run
    once per micro-batch instead of once per rank. 1 = off; above 1 a multiple of ulysses x ring; needs frozen
    condition encoders (conditions carry no autograd graph across ranks)."""


__all__ = ["CompileMode", "CompilePlanConfig", "FeaturesConfig", "ModulePlanConfig", "RecomputePlanConfig"]
