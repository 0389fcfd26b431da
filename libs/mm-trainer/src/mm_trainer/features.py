"""Forward-level features applied BEFORE FSDP wrapping: recompute and activation offload.

Both replace a matched module's ``forward`` on the instance, so the wrapper
runs inside ``module.__call__`` and therefore inside the FSDP2 unit's
pre/post-forward hooks (all-gather before, reshard after). In backward, FSDP's
pre-backward hook gathers the unit's parameters before autograd unpacks the
saved tensors that trigger recomputation. The trainer applies features before
``fully_shard`` (DESIGN.md build order) so that this placement never depends on
how a torch version installs its hooks.

A module in both plans gets both, composed: offload wraps recompute. The checkpoint keeps only
the module's inputs (its activations are recomputed in backward), and those inputs are what the
offload hooks move to host memory. (The other order would not compose: autograd uses only the
innermost saved-tensor hooks, so offload hooks inside the checkpoint would store every activation
and nothing would be recomputed.) For the same reason an offloaded module *inside* a recomputed one
is refused: its activations would be stored instead of recomputed.
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
    """Wrap modules matched by the plan patterns (DESIGN.md syntax). Call before ``apply_fsdp_plan``.

    Recompute is applied first, so that on a module matched by both plans the offload wraps it
    (see the module docstring).
    """
    report = FeaturesReport(
        recompute=_matched_paths(model, recompute_modules),
        activation_offload=_matched_paths(model, activation_offload_modules),
    )
    _refuse_offload_inside_recompute(report)
    for path in report.recompute:
        _wrap_forward(model.get_submodule(path), RECOMPUTE_MARK, _recompute_forward)
    for path in report.activation_offload:
        _wrap_forward(model.get_submodule(path), OFFLOAD_MARK, _offload_forward)
    return report


def _refuse_offload_inside_recompute(report: FeaturesReport) -> None:
    for inner in report.activation_offload:
        outer = next((r for r in report.recompute if inner.startswith(r + ".")), None)
        if outer is not None:
            raise ValueError(
                f"features: activation_offload_plan matches {inner!r} inside {outer!r} of recompute_plan; "
                "its activations would be stored on the host instead of recomputed. Offload the "
                f"recomputed module itself ({outer!r}: both compose) or neither"
            )


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
