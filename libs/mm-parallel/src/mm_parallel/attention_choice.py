"""Which kernel runs the ring-attention blocks: a run's explicit choice or ``auto``, logged once.

``auto`` picks the fused kernel of the device: ``cpu_flash`` on CPU, ``flash`` on CUDA
(``efficient`` below compute capability 8.0, where torch has no flash kernel), ``npu`` on Ascend. It
never picks ``math`` on an accelerator silently: on a device with no fused LSE kernel it logs a
warning, and the first ring call on ``math`` off the CPU states the bytes its score tensors take.

A run states its choice once (:func:`use_attention_backend`, called by the trainer from
``parallel.attention_backend``); ring / USP attention called with ``backend=None`` then use it.
Without one, the first ring call on a device resolves ``auto`` for it and logs that.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import Tensor

from mm_parallel.attention_backends import (
    AttentionBackend,
    available_backends,
    get_backend,
    ring_backend_names,
)
from mm_parallel.attention_memory import math_score_bytes

logger = logging.getLogger("mm_parallel")

AUTO = "auto"
_AUTO_KERNEL = {"cpu": "cpu_flash", "cuda": "flash", "npu": "npu"}


@dataclass(frozen=True)
class AttentionChoice:
    """The kernel ring attention runs its blocks on for one device type, and why."""

    backend: str
    device_type: str
    reason: str

    def __str__(self) -> str:
        return f"{self.backend} on {self.device_type}: {self.reason}"


_CHOSEN: dict[str, AttentionChoice] = {}
_MATH_WARNED: set[tuple[int, ...]] = set()


def _cuda_before_ampere() -> bool:
    if not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability() < (8, 0)


def _auto(device_type: str) -> AttentionChoice:
    name = _AUTO_KERNEL.get(device_type, "math")
    if name == "flash" and _cuda_before_ampere():
        name = "efficient"
    if name != "math" and name in available_backends():
        summary = get_backend(name).summary
        return AttentionChoice(name, device_type, f"auto: the fused kernel of {device_type} ({summary})")
    if device_type == "cpu":
        return AttentionChoice("math", device_type, "auto: torch has no CPU flash kernel here")
    reason = (
        f"auto: no fused LSE kernel is registered for {device_type!r}; ring blocks run on math, which "
        "materializes [B, H, Sq, Sk] float32 scores (the first ring call states their bytes)"
    )
    logger.warning("attention backend: %s", reason)
    return AttentionChoice("math", device_type, reason)


def _device_type(device: torch.device | str) -> str:
    # a string is split rather than parsed: "npu" is a device type only once torch_npu is imported
    return device.split(":")[0] if isinstance(device, str) else device.type


def resolve_attention_backend(requested: str, device: torch.device | str) -> AttentionChoice:
    """The ring kernel for ``requested`` (a backend name or ``"auto"``) on ``device``, validated.

    Raises a clear error for an unknown name (``KeyError``), a kernel not installed here
    (``RuntimeError``), or one that cannot run ring blocks on this device (``ValueError``).
    """
    device_type = _device_type(device)
    if requested == AUTO:
        return _auto(device_type)
    backend = get_backend(requested)  # KeyError / RuntimeError naming the others
    if requested not in ring_backend_names():
        raise ValueError(
            f"attention backend {requested!r} cannot run ring-attention blocks (they need the LSE and a "
            f"block backward); ring kernels here: {_usable()}"
        )
    if not backend.runs_on(device_type):
        raise ValueError(
            f"attention backend {requested!r} runs on {list(backend.device_types)}, not on this run's device "
            f"{device_type!r}; use auto or one of {[n for n in _usable() if get_backend(n).runs_on(device_type)]}"
        )
    return AttentionChoice(requested, device_type, f"parallel.attention_backend ({backend.summary})")


def _usable() -> list[str]:
    return [n for n in ring_backend_names() if n in available_backends()]


def use_attention_backend(requested: str, device: torch.device | str) -> AttentionChoice:
    """Resolve and remember the run's ring kernel for ``device``; returns it (for the run's log line)."""
    choice = resolve_attention_backend(requested, device)
    _CHOSEN[choice.device_type] = choice
    logger.info("ring attention kernel: %s", choice)
    return choice


def ring_kernel(device: torch.device, requested: str | None = None) -> AttentionBackend:
    """The backend a ring call on ``device`` uses: ``requested``, else the run's choice, else auto."""
    if requested is not None:
        return get_backend(resolve_attention_backend(requested, device).backend)
    if device.type not in _CHOSEN:
        use_attention_backend(AUTO, device)
    return get_backend(_CHOSEN[device.type].backend)


def warn_if_math_on_accelerator(kernel: AttentionBackend, q: Tensor, k: Tensor) -> None:
    """Log once per shape what the ``math`` kernel allocates per block when it runs off the CPU."""
    if kernel.name != "math" or q.device.type == "cpu":
        return
    b, sq, h, _ = q.shape
    key = (b, sq, k.size(1), h)
    if key in _MATH_WARNED:
        return
    _MATH_WARNED.add(key)
    one = math_score_bytes(b, h, sq, k.size(1), q.dtype)
    logger.warning(
        "ring attention on %s runs the math kernel: each block materializes [B, H, Sq, Sk] = [%d, %d, %d, %d] "
        "score tensors of %.2f GiB (up to 4 at once in backward: %.2f GiB)",
        q.device.type, b, h, sq, k.size(1), one / 2**30, 4 * one / 2**30,
    )  # fmt: skip
