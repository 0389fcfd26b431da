"""Gradient-sync control for gradient accumulation with FSDP2."""

from __future__ import annotations

from torch import nn
from torch.distributed.fsdp import FSDPModule


def fsdp_roots(model: nn.Module) -> list[FSDPModule]:
    """Outermost FSDP units of ``model`` (one per sub-model of a container, else the model)."""
    roots: list[FSDPModule] = []

    def visit(module: nn.Module) -> None:
        if isinstance(module, FSDPModule):
            roots.append(module)
            return
        for child in module.children():
            visit(child)

    visit(model)
    return roots


def set_gradient_sync(model: nn.Module, is_last_microstep: bool) -> None:
    """Call before each micro-step's backward.

    On non-final micro-steps gradients accumulate locally (no reduce-scatter, no
    HSDP all-reduce); on the final one FSDP reduces the accumulated gradients and
    waits for the reduction at the end of backward. Covers every FSDP root, so a
    container whose sub-models are separate roots is handled as a whole.
    """
    for root in fsdp_roots(model):
        root.set_requires_gradient_sync(is_last_microstep, recurse=True)
        root.set_is_last_backward(is_last_microstep)
