"""What a pipeline needs of a model container: sub-modules by role name and their trainability."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn


@runtime_checkable
class TrainabilityAware(Protocol):
    """Optional container capability: say whether the sub-model stored under ``role`` trains.

    A container is any object holding sub-modules as attributes named by role
    (``container.ae``, ``container.text_encoder``, ``container.predictor``). When it also
    implements ``is_trainable(role)`` the pipeline trusts it; otherwise a role is trainable
    iff any of its parameters requires grad.
    """

    def is_trainable(self, role: str) -> bool:
        """Whether the sub-model under attribute ``role`` is trained."""
        ...


def get_submodule(container: Any, role: str, roles: Mapping[str, str] | None = None) -> nn.Module:
    """The sub-module playing ``role`` (attribute ``roles.get(role, role)`` of ``container``)."""
    attr = (roles or {}).get(role, role)
    module = getattr(container, attr, None)
    if module is None:
        known = _submodule_names(container)
        raise AttributeError(
            f"container {type(container).__name__} has no sub-model {attr!r} for role {role!r}; "
            f"its sub-models are {known}"
        )
    return module


def _submodule_names(container: Any) -> list[str]:
    if isinstance(container, nn.Module):
        return sorted(container._modules)
    return sorted(n for n, v in getattr(container, "__dict__", {}).items() if isinstance(v, nn.Module))


def is_trainable(container: Any, role: str, roles: Mapping[str, str] | None = None) -> bool:
    """Whether the sub-model playing ``role`` trains (container's answer, else ``requires_grad``)."""
    attr = (roles or {}).get(role, role)
    if isinstance(container, TrainabilityAware):
        return bool(container.is_trainable(attr))
    module = get_submodule(container, role, roles)
    return any(p.requires_grad for p in module.parameters())


def call_role(
    container: Any,
    role: str,
    *args: Any,
    roles: Mapping[str, str] | None = None,
    method: str = "forward",
    **kwargs: Any,
) -> Any:
    """Call a sub-model with grad enabled only if it is trainable.

    ``method="forward"`` calls ``module(*args, **kwargs)`` so FSDP2 / feature hooks fire;
    any other name calls that bound method (FSDP2 hooks it only if registered with
    ``register_fsdp_forward_method``).
    """
    module = get_submodule(container, role, roles)
    fn = module if method == "forward" else getattr(module, method, None)
    if fn is None:
        raise AttributeError(f"sub-model {type(module).__name__} for role {role!r} has no method {method!r}")
    with torch.set_grad_enabled(torch.is_grad_enabled() and is_trainable(container, role, roles)):
        return fn(*args, **kwargs)
