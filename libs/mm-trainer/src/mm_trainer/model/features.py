"""Forward-level features applied BEFORE FSDP wrapping: compile, recompute and activation offload.

All three replace a matched module's ``forward`` on the instance, so the wrapper
runs inside ``module.__call__`` and therefore inside the FSDP2 unit's
pre/post-forward hooks (all-gather before, reshard after). In backward, FSDP's
pre-backward hook gathers the unit's parameters before autograd unpacks the
saved tensors that trigger recomputation. The trainer applies features before
``fully_shard`` (docs/DESIGN.md "Build order") so that this placement never depends on
how a torch version installs its hooks.

A module in both plans gets both, composed: offload wraps recompute. The checkpoint keeps only
the module's inputs (its activations are recomputed in backward), and those inputs are what the
offload hooks move to host memory. (The other order would not compose: autograd uses only the
innermost saved-tensor hooks, so offload hooks inside the checkpoint would store every activation
and nothing would be recomputed.) For the same reason an offloaded module *inside* a recomputed one
is refused: its activations would be stored instead of recomputed.

Compile is the innermost wrapper: recompute checkpoints the *compiled* forward. (torchtitan
compiles around the checkpoint instead, which lets the compiler pick what to save; but dynamo
cannot compile a checkpointed region that holds a graph break, and mm-parallel's ring attention is
one on purpose, so that order would leave every ring-attention block uncompiled.) Full
recompute keeps the compiled forward's inputs and runs it again in backward; selective recompute
keeps what its policy saves (:mod:`mm_trainer.model.recompute_policy`) of the ops the compiled code runs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from mm_config import FeaturesConfig
from mm_parallel import match_modules
from torch import nn
from torch.utils.checkpoint import checkpoint

from mm_trainer.model.recompute_policy import selective_recompute_contexts
from mm_trainer.model.regional_compile import compiled_forward

RECOMPUTE_MARK = "_mm_recompute"
OFFLOAD_MARK = "_mm_activation_offload"
COMPILE_MARK = "_mm_compile"
RecomputePolicy = Literal["full", "selective"]


@dataclass
class FeaturesReport:
    """Module paths each feature was applied to, and how."""

    recompute: list[str] = field(default_factory=list)
    activation_offload: list[str] = field(default_factory=list)
    compile: list[str] = field(default_factory=list)
    recompute_policy: RecomputePolicy = "full"
    recompute_every: int = 1
    compile_backend: str = "inductor"
    compile_mode: str = "default"

    def lines(self) -> list[str]:
        """One line per feature in use, for ``--dry-run`` and the run log."""
        out = []
        if self.compile:
            how = f"torch.compile backend={self.compile_backend} mode={self.compile_mode}"
            out.append(f"compile ({how}): {_paths(self.compile)}")
        if self.recompute:
            every = f", every {self.recompute_every} matched" if self.recompute_every > 1 else ""
            out.append(f"recompute ({self.recompute_policy}{every}): {_paths(self.recompute)}")
        if self.activation_offload:
            out.append(f"activation offload: {_paths(self.activation_offload)}")
        return out


def feature_plans(features: FeaturesConfig) -> dict[str, Any]:
    """The keywords of :func:`apply_features` / :func:`plan_features` from the ``features`` section."""
    recompute, compile_ = features.recompute_plan, features.compile
    return {
        "recompute_modules": recompute.apply_modules,
        "recompute_policy": recompute.policy,
        "recompute_every": recompute.every,
        "compile_modules": compile_.apply_modules,
        "compile_backend": compile_.backend,
        "compile_mode": compile_.mode,
        "activation_offload_modules": features.activation_offload_plan.apply_modules,
    }


def _paths(paths: list[str]) -> str:
    return f"{len(paths)} module(s): " + ", ".join(paths)


def plan_features(
    model: nn.Module,
    *,
    recompute_modules: Iterable[str] = (),
    recompute_policy: RecomputePolicy = "full",
    recompute_every: int = 1,
    compile_modules: Iterable[str] = (),
    compile_backend: str = "inductor",
    compile_mode: str = "default",
    activation_offload_modules: Iterable[str] = (),
) -> FeaturesReport:
    """What :func:`apply_features` would do to ``model`` (paths in module order), changing nothing.

    ``recompute_every=k`` keeps the 1st, (k+1)-th, ... matched recompute module in module order.
    """
    if recompute_policy not in ("full", "selective"):
        raise ValueError(f"recompute_policy={recompute_policy!r}: expected 'full' or 'selective'")
    if recompute_every < 1:
        raise ValueError(f"recompute_every={recompute_every}: expected >= 1")
    report = FeaturesReport(
        recompute=_matched_paths(model, recompute_modules)[::recompute_every],
        activation_offload=_matched_paths(model, activation_offload_modules),
        compile=_matched_paths(model, compile_modules),
        recompute_policy=recompute_policy,
        recompute_every=recompute_every,
        compile_backend=compile_backend,
        compile_mode=compile_mode,
    )
    _refuse_offload_inside_recompute(report)
    return report


def apply_features(model: nn.Module, **plans: Any) -> FeaturesReport:
    """Wrap modules matched by the plan patterns (docs/DESIGN.md "Pattern syntax"). Call before ``apply_fsdp_plan``.

    Keywords as :func:`plan_features`. Compile wraps first, then recompute, then offload, so that on
    a module matched by several plans each wraps the one before (see the module docstring).
    """
    report = plan_features(model, **plans)
    recompute = functools.partial(_recompute_forward, selective=report.recompute_policy == "selective")
    for paths, mark, wrapper in (
        (report.compile, COMPILE_MARK, compiled_forward(report.compile_backend, report.compile_mode)),
        (report.recompute, RECOMPUTE_MARK, recompute),
        (report.activation_offload, OFFLOAD_MARK, _offload_forward),
    ):
        for path in paths:
            _wrap_forward(model.get_submodule(path), mark, wrapper)
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
    matched = {p for paths in match_modules(model, patterns).values() for p in paths}
    return [name for name, _ in model.named_modules() if name in matched]  # module order


def _wrap_forward(
    module: nn.Module, mark: str, wrapper: Callable[[Callable[..., Any]], Callable[..., Any]]
) -> None:
    if getattr(module, mark, False):
        return
    module.forward = wrapper(module.forward)  # instance attribute: inside module.__call__ hooks
    setattr(module, mark, True)


def _recompute_forward(forward: Callable[..., Any], *, selective: bool) -> Callable[..., Any]:
    extra = {"context_fn": selective_recompute_contexts} if selective else {}

    @functools.wraps(forward)
    def recomputed(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **extra, **kwargs)

    return recomputed


def offload_options(args: Any) -> dict[str, Any]:
    """``save_on_cpu`` keywords for a forward called with ``args``: the device type of its first tensor
    (the device in use), and pinned copies on an accelerator.

    ``save_on_cpu(pin_memory, device_type="cuda")`` pins the host copies only where
    ``torch.<device_type>.is_available()``, and copies back with ``non_blocking=pin_memory``: without
    ``device_type`` an NPU's copies were pageable and blocking.
    """
    device_type = next((t.device.type for t in _flat(args) if isinstance(t, torch.Tensor)), "cpu")
    return {"pin_memory": device_type not in ("cpu", "meta"), "device_type": device_type}


def _flat(value: Any) -> Iterable[Any]:
    """The leaves of nested tuples, lists and dicts (a forward's positional and keyword arguments)."""
    if isinstance(value, (tuple, list)):
        for item in value:
            yield from _flat(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _flat(item)
    else:
        yield value


def _offload_forward(forward: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(forward)
    def offloaded(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        # Saved activations go to host memory (pinned, copied asynchronously on accelerators)
        # and come back on use in backward. On CPU tensors already live on the host.
        with torch.autograd.graph.save_on_cpu(**offload_options((args, kwargs))):
            return forward(*args, **kwargs)

    return offloaded
