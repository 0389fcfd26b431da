"""Forward-level features applied BEFORE FSDP wrapping: recompute and activation offload.

Both replace a matched module's ``forward`` on the instance, so the wrapper
runs inside ``module.__call__`` and therefore inside the FSDP2 unit's
pre/post-forward hooks (all-gather before, reshard after). In backward, FSDP's
pre-backward hook gathers the unit's parameters before autograd unpacks the
saved tensors that trigger recomputation. The trainer applies features before
``fully_shard`` (DESIGN.md build order) so that this placement never depends on
how a torch version installs its hooks.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from mm_parallel import match_modules
from torch import nn
from torch.utils.checkpoint import checkpoint

RECOMPUTE_MARK = "_mm_recompute"
OFFLOAD_MARK = "_mm_activation_offload"


@dataclass
class FeaturesReport:
    """Module paths each feature was applied to."""

    recompute: list[str] = field(default_factory=list)
    activation_offload: list[str] = field(default_factory=list)


def apply_features(
    model: nn.Module,
    *,
    recompute_modules: Iterable[str] = (),
    activation_offload_modules: Iterable[str] = (),
) -> FeaturesReport:
    """Wrap modules matched by the plan patterns (DESIGN.md syntax). Call before ``apply_fsdp_plan``."""
    report = FeaturesReport()
    for path in _matched_paths(model, activation_offload_modules):
        _wrap_forward(model.get_submodule(path), OFFLOAD_MARK, _offload_forward)
        report.activation_offload.append(path)
    for path in _matched_paths(model, recompute_modules):
        _wrap_forward(model.get_submodule(path), RECOMPUTE_MARK, _recompute_forward)
        report.recompute.append(path)
    return report


def _matched_paths(model: nn.Module, patterns: Iterable[str]) -> list[str]:
    patterns = list(patterns)
    if not patterns:
        return []
    matches = match_modules(model, patterns)
    return sorted({p for paths in matches.values() for p in paths})


def _wrap_forward(
    module: nn.Module, mark: str, wrapper: Callable[[Callable[..., Any]], Callable[..., Any]]
) -> None:
    if getattr(module, mark, False):
        return
    module.forward = wrapper(module.forward)  # instance attribute: inside module.__call__ hooks
    setattr(module, mark, True)


def _recompute_forward(forward: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(forward)
    def recomputed(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return recomputed


def _offload_forward(forward: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(forward)
    def offloaded(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        # Saved activations go to host memory (pinned, copied asynchronously on accelerators)
        # and come back on use in backward. On CPU tensors already live on the host.
        pin = torch.cuda.is_available() or hasattr(torch, "npu")
        with torch.autograd.graph.save_on_cpu(pin_memory=pin):
            return forward(*args, **kwargs)

    return offloaded
