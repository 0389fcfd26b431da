"""Selective recompute (``features.recompute_plan.policy: selective``): which ops' outputs are kept.

Kept: matrix multiplications, convolutions and attention kernels, the outputs that cost the most
to compute. Everything else a checkpointed module runs (norms, activations, modulation, RoPE,
residuals, reshapes, and context-parallel collectives) is run again in backward. Applied with
``torch.utils.checkpoint.create_selective_checkpoint_contexts``.

Only the functional overloads are kept (``aten.mm.default``, not ``aten.mm.out``): inductor-compiled
code (``features.compile``) writes its matmul results into buffers it reuses, which a checkpoint cannot
keep, so inside a compiled block those matmuls are recomputed too (what that costs is measured by
``benchmarks/wan_levers.py``).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

_aten = torch.ops.aten
SAVED_OPS = frozenset(
    {
        _aten.mm,
        _aten.addmm,
        _aten.bmm,
        _aten.baddbmm,
        _aten.convolution,
        _aten._scaled_dot_product_flash_attention,
        _aten._scaled_dot_product_flash_attention_for_cpu,
        _aten._scaled_dot_product_efficient_attention,
        _aten._scaled_dot_product_cudnn_attention,
        _aten._flash_attention_forward,
        _aten._efficient_attention_forward,
    }
)
"""Op packets whose functional outputs selective recompute keeps for backward."""


def _policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    functional = not op._schema.is_mutable  # an out= / in-place overload writes a buffer it may reuse
    keep = functional and op.overloadpacket in SAVED_OPS
    return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE


selective_recompute_contexts = functools.partial(create_selective_checkpoint_contexts, _policy)
"""``context_fn`` for ``torch.utils.checkpoint.checkpoint``: keep :data:`SAVED_OPS`, recompute the rest."""
