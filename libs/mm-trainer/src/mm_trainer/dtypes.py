"""Dtype names used in configs."""

from __future__ import annotations

import torch

_DTYPES = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "float": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "half": torch.float16,
}


def to_dtype(name: str | torch.dtype | None) -> torch.dtype | None:
    """Map a config dtype name (``bf16``, ``float32``...) to a torch dtype; None stays None."""
    if name is None or isinstance(name, torch.dtype):
        return name
    try:
        return _DTYPES[str(name).lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; expected one of {sorted(_DTYPES)}") from None
