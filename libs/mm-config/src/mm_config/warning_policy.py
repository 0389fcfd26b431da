"""The project's warning policy: every warning a run prints is fixed, or allowed here with its reason.

:data:`ALLOWED_WARNINGS` is the one allowlist. The test suite runs with warnings as errors plus
these entries (the root ``conftest.py`` adds :func:`pytest_filter_lines` to pytest's
``filterwarnings``); the training console scripts (``mm_trainer.cli.run``: mm-train and the
apps) install them with :func:`install_warning_filters`, so a user's log carries no known, harmless
upstream noise while any other warning still shows (and, under ``PYTHONWARNINGS=error``, fails the
run: these filters go in front of it). Only upstream warnings the project cannot fix belong here; the
project's own were fixed at their source.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass


@dataclass(frozen=True)
class AllowedWarning:
    """One allowed warning: ``message`` (a regex matched at the start of the text), its category,
    the module that emits it (regex matched at the start of the module name) and why it is allowed."""

    message: str
    category: type[Warning]
    module: str
    reason: str


ALLOWED_WARNINGS: tuple[AllowedWarning, ...] = (
    AllowedWarning(
        "'set_vital' is deprecated, please do not call",
        UserWarning,
        r"torchdata\.stateful_dataloader",
        "torchdata 0.11.0 (its last release) calls torch.set_vital in StatefulDataLoader, which torch 2.13 "
        "deprecated; a no-op there",
    ),
    AllowedWarning(
        r"`torch\.jit\.script_method` is deprecated",
        DeprecationWarning,
        r"torch\.jit\._script",
        "torch 2.13's own torch.utils.mkldnn (imported by inductor on the first torch.compile) still "
        "defines ScriptModules",
    ),
    AllowedWarning(
        r"The \.grad attribute of a Tensor that is not a leaf Tensor is being accessed",
        UserWarning,
        r"(torch\._dynamo\.variables\.builder|torch\._subclasses\.meta_utils)$",
        "torch 2.13's dynamo probes .grad of non-leaf tensors while tracing (safe_has_grad in "
        "_dynamo.variables.builder, safe_grad in _subclasses.meta_utils: the warning names the probe's "
        "module) and hides the warning through warnings.showwarning (torch._logging.hide_warnings), "
        "which an 'error' filter never reaches",
    ),
)


def install_warning_filters() -> None:
    """Ignore the :data:`ALLOWED_WARNINGS` in this process (ahead of any ``-W`` / ``PYTHONWARNINGS``)."""
    for allowed in ALLOWED_WARNINGS:
        warnings.filterwarnings("ignore", allowed.message, allowed.category, allowed.module)


def pytest_filter_lines() -> list[str]:
    """The :data:`ALLOWED_WARNINGS` as pytest ``filterwarnings`` lines (``ignore:message:Category:module``)."""
    return [
        f"ignore:{a.message}:{a.category.__module__}.{a.category.__qualname__}:{a.module}"
        for a in ALLOWED_WARNINGS
    ]


__all__ = ["ALLOWED_WARNINGS", "AllowedWarning", "install_warning_filters", "pytest_filter_lines"]
