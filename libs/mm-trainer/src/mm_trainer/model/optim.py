"""Optimizer and learning-rate schedule from the ``training`` section."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

NO_DECAY_NAME_PARTS = ("bias", "norm", "modulation", "scale_shift_table", "embedding.weight")


def param_groups(model: nn.Module, weight_decay: float, only: tuple[str, ...] | None = None) -> list[dict]:
    """Trainable parameters split into decay / no-decay groups (biases, norms, 1-D params: no decay);
    with ``only``, those of the named top-level sub-modules alone (a training phase's)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad or (only is not None and name.split(".", 1)[0] not in only):
            continue
        if p.ndim <= 1 or any(part in name.lower() for part in NO_DECAY_NAME_PARTS):
            no_decay.append(p)
        else:
            decay.append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def build_optimizer(
    model: nn.Module,
    *,
    lr: float,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    device_type: str = "cpu",
    only: tuple[str, ...] | None = None,
) -> torch.optim.Optimizer:
    """AdamW over trainable params (of the sub-modules ``only`` names, if given); fused on CUDA/NPU,
    foreach elsewhere."""
    groups = param_groups(model, weight_decay, only)
    if not groups:
        raise ValueError(
            "no trainable parameters: every sub-model is frozen (see training.trainable_submodels)"
        )
    fused = device_type in ("cuda", "npu")
    return torch.optim.AdamW(
        groups, lr=lr, betas=betas, eps=eps, fused=fused or None, foreach=None if fused else True
    )


def lr_lambda(step: int, *, kind: str, warmup: int, total: int, min_ratio: float) -> float:
    """Multiplier of the base lr at ``step``: linear warmup, then constant / linear / cosine decay."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if kind == "constant":
        return 1.0
    span = max(1, total - warmup)
    progress = min(1.0, (step - warmup) / span)
    if kind == "linear":
        return min_ratio + (1.0 - min_ratio) * (1.0 - progress)
    if kind == "cosine":
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"training.lr_scheduler: unknown schedule {kind!r}; expected constant, linear or cosine")


def build_lr_scheduler(
    optimizer: torch.optim.Optimizer,
    *,
    kind: str,
    warmup: int,
    total: int,
    lr: float,
    min_lr: float = 0.0,
) -> torch.optim.lr_scheduler.LambdaLR:
    """A stateful LambdaLR (saved and restored with the checkpoint)."""
    ratio = (min_lr / lr) if lr > 0 else 0.0
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_lambda(step, kind=kind, warmup=warmup, total=total, min_ratio=ratio)
    )


def trainable_parameters(model: nn.Module) -> Iterable[nn.Parameter]:
    """Parameters that receive gradients."""
    return [p for p in model.parameters() if p.requires_grad]
