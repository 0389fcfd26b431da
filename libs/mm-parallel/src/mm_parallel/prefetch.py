"""Explicit FSDP2 forward/backward prefetch, limited to units of the same sub-model.

A container runs its sub-models one after another (VAE, text encoder, DiT), so
prefetching across a sub-model boundary (the DiT's last block gathering the text
encoder's first layer) only wastes memory: the owner filter forbids it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from torch import nn
from torch.distributed.fsdp import FSDPModule

from mm_parallel.unit_layout import UnitSpec


def execution_order(units: Sequence[UnitSpec], model: nn.Module) -> list[UnitSpec]:
    """Units sorted by module registration (pre-)order, the usual forward order."""
    rank = {name: i for i, (name, _) in enumerate(model.named_modules())}
    return sorted(units, key=lambda u: rank[u.path])


def prefetch_lists(
    units: Sequence[UnitSpec], model: nn.Module, num_forward: int, num_backward: int
) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Forward and backward prefetch targets per unit path, never crossing owners.

    Forward: each unit prefetches the next ``num_forward`` units of its sub-model in
    execution order. Backward: the previous ``num_backward`` units, nearest first.
    """
    forward: dict[str, list[str]] = {}
    backward: dict[str, list[str]] = {}
    for owner in dict.fromkeys(u.owner for u in units):
        chain = [u.path for u in execution_order([u for u in units if u.owner == owner], model)]
        for i, path in enumerate(chain):
            if num_forward and chain[i + 1 : i + 1 + num_forward]:
                forward[path] = chain[i + 1 : i + 1 + num_forward]
            if num_backward and i > 0:
                backward[path] = chain[max(0, i - num_backward) : i][::-1]
    return forward, backward


def set_prefetch(
    model: nn.Module, forward: Mapping[str, list[str]], backward: Mapping[str, list[str]]
) -> None:
    """Install prefetch lists (paths of FSDP units of ``model``) with FSDP2's explicit API."""
    modules = dict(model.named_modules())

    def fsdp(path: str) -> FSDPModule:
        module = modules[path]
        if not isinstance(module, FSDPModule):
            raise TypeError(f"prefetch target {path!r} is not an FSDP unit")
        return module

    for path, targets in forward.items():
        fsdp(path).set_modules_to_forward_prefetch([fsdp(t) for t in targets])
    for path, targets in backward.items():
        fsdp(path).set_modules_to_backward_prefetch([fsdp(t) for t in targets])


def cross_submodel_pairs(units: Sequence[UnitSpec], model: nn.Module, order: Sequence[str]) -> dict[str, str]:
    """Source unit path -> target unit path for consecutive sub-models of ``order``.

    The source is the last unit of a sub-model in execution order, the target the first unit of
    the next one (its FSDP root when that holds parameters of its own, else its first block).

    Raises:
        ValueError: a name that is no sub-model with FSDP units, naming the ones that have some.
    """
    chains: dict[str, list[str]] = {}
    for owner in dict.fromkeys(u.owner for u in units):
        owned = [u for u in units if u.owner == owner and u.param_names]
        chains[owner] = [u.path for u in execution_order(owned, model)]
    for name in order:
        if not chains.get(name):
            raise ValueError(
                f"parallel.fsdp_plan.cross_submodel_prefetch: {name!r} is not a sub-model with FSDP units; "
                f"sub-models with units: {sorted(k for k, v in chains.items() if v)}"
            )
    return {chains[a][-1]: chains[b][0] for a, b in zip(order, order[1:])}


def install_cross_submodel_prefetch(
    model: nn.Module, pairs: Mapping[str, str], forward: Mapping[str, list[str]]
) -> None:
    """Add each target to its source's forward prefetch (after ``forward[source]``, the in-chain list).

    FSDP2 sets up a sub-model root's communication state in its first forward, and prefetching a
    root before that fails; so each pair is installed by a one-shot hook after the target's first
    forward, and takes effect from the next step.
    """
    modules = dict(model.named_modules())
    for source, target in pairs.items():
        _install_after_first_forward(
            modules[target], modules[source], [modules[p] for p in forward.get(source, [])]
        )


def _install_after_first_forward(target: nn.Module, source: nn.Module, chain: list[nn.Module]) -> None:
    def install(module: nn.Module, args: object, output: object) -> None:
        source.set_modules_to_forward_prefetch([*chain, target])  # type: ignore[operator]
        handle.remove()

    handle = target.register_forward_hook(install)
