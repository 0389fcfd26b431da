"""``features.compile``: ``torch.compile`` of matched modules' forwards (regional compilation).

Each matched module's ``forward`` is replaced on the instance by its compiled version, so the
FSDP2 hooks in ``module.__call__`` stay eager around it (they gather the parameters as plain
tensors before the compiled code runs) and identical blocks share one compiled graph (dynamo
takes module parameters as inputs, so no block-specific guard forces a recompile). The compiled
forward is the innermost wrapper: recompute and offload wrap it (see :mod:`mm_trainer.model.features`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def check_compile(backend: str, mode: str, device_type: str) -> None:
    """Refuse a ``features.compile`` choice this device cannot run, before any model is built."""
    where = "features.compile"
    if backend == "inductor" and device_type == "npu":
        raise ValueError(
            f"{where}.backend=inductor: inductor generates no Ascend NPU code. Set {where}.backend to "
            "a backend registered with torch._dynamo for the NPU (torch_npu's torchair), or leave "
            f"{where}.apply_modules empty"
        )
    import torch._dynamo

    known = torch._dynamo.list_backends(exclude_tags=())
    if backend not in known:
        raise ValueError(
            f"{where}.backend={backend!r} is not a registered torch.compile backend; known: {known}"
        )
    if mode != "default" and backend != "inductor":
        raise ValueError(f"{where}.mode={mode!r} applies to the inductor backend only, not {backend!r}")
    if mode == "reduce-overhead" and device_type != "cuda":
        raise ValueError(f"{where}.mode=reduce-overhead captures CUDA graphs; {device_type} has none")
    if backend == "inductor" and device_type == "cpu":
        _check_cpp_compiler()


def _check_cpp_compiler() -> None:
    from torch._inductor.cpp_builder import get_cpp_compiler

    try:
        get_cpp_compiler()
    except Exception as err:  # inductor's own lookup: the compiler it would run
        raise ValueError(
            f"features.compile.backend=inductor on CPU needs a C++ compiler (g++ or clang++): {err}"
        ) from err


def compiled_forward(backend: str, mode: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The wrapper that compiles one module's ``forward`` (for :func:`mm_trainer.apply_features`)."""

    def wrap(forward: Callable[..., Any]) -> Callable[..., Any]:
        return torch.compile(forward, backend=backend, mode=None if mode == "default" else mode)

    return wrap
