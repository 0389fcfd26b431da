"""Packed forward of the Wan DiT: several latents of different shapes in one token sequence.

Each sample is patch-embedded on its own and the token sequences are concatenated (one row,
``[1, S_0 + S_1 + ..., dim]``); every sample keeps its own

- **timestep**: its time embedding and adaLN modulation are expanded over its tokens (the per-token
  path TI2V uses), so samples at different noise levels share a micro-batch;
- **RoPE positions**: the tables of its own latent grid, concatenated in sample order;
- **text**: the texts are concatenated too, and cross-attention pairs each sample's tokens with its
  own text only (:func:`mm_parallel.packed_attention` with the text's segments as keys);
- **self-attention**: block-diagonal, each sample's tokens attend to the sample's tokens only.

What changes under context parallelism is a :class:`PackedOps` (how the packed stream is split,
gathered and attended), built per forward by the model's packing seam: :func:`one_process_ops` by
default, :func:`context_parallel_ops` (Ulysses x Ring, each sample split on its own:
:class:`mm_parallel.PackedLayout`) once ``WanPredictor.setup_context_parallel`` ran. The ops bind the
forward's layout in closures instead of setting state on a shared plan, so a recomputed block (in the
backward) runs with its own forward's packing. Their attentions stay out of a compiled block's graphs
(:func:`outside_compile`), so ``features.compile`` does not recompile for every packing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from mm_parallel import (
    PackedSequence,
    gather_packed,
    packed_attention,
    split_packed,
    takes_projections,
    usp_attention,
)

from .rope import rope_cos_sin

if TYPE_CHECKING:
    from mm_parallel import SequenceParallelPlan

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class PackedOps:
    """How one packed forward's token stream is split, gathered and attended.

    ``split(x, dim)`` / ``gather(x, dim, total)`` as ``WanDiT.enable_context_parallel``'s;
    ``self_attention(q, k, v)`` over the split tokens ([B, S_local, H, D]; marked ``takes_projections`` under
    context parallelism: q, k, v may be their projections); ``cross_attention(q, k, v)``
    of the local tokens to the packed texts (every text whole on every rank).
    """

    split: Callable[[torch.Tensor, int], torch.Tensor]
    gather: Callable[[torch.Tensor, int, int], torch.Tensor]
    self_attention: AttentionFn
    cross_attention: AttentionFn


PackingFn = Callable[[PackedSequence, PackedSequence], PackedOps]
"""``(video packing, text packing) -> PackedOps`` of one forward."""


def outside_compile(attention: AttentionFn) -> AttentionFn:
    """``attention`` run eagerly inside a compiled block (``features.compile``): a deliberate graph break.

    A packed attention's segments are Python ints of this forward's packing; traced, the block's graphs
    would guard on them and recompile for every new mix of samples. Left out, the graphs see only the
    token counts (dynamic from the second packing on), so a block compiles twice in all (measured:
    ``tests/test_wan_packed_step.py``)."""
    return torch.compiler.disable(attention)


def one_process_ops(video: PackedSequence, text: PackedSequence) -> PackedOps:
    """The whole packed sequence on this process: block-diagonal attention, no split."""
    return PackedOps(
        split=lambda x, dim: x,
        gather=lambda x, dim, total: x,
        self_attention=outside_compile(lambda q, k, v: packed_attention(q, k, v, video)),
        cross_attention=outside_compile(lambda q, k, v: packed_attention(q, k, v, video, text)),
    )


def context_parallel_ops(plan: SequenceParallelPlan) -> PackingFn:
    """Packing over ``plan``'s Ulysses x Ring groups (:func:`mm_parallel.split_packed`, ``usp_attention``
    with ``packed=``); cross-attention pairs this rank's segments (``real_0, pad_0, ...``) with
    ``text_0, 0, text_1, 0, ...``: pad tokens see no text and get zeros (dropped by the gather)."""

    def ops(video: PackedSequence, text: PackedSequence) -> PackedOps:
        if not plan.enabled:
            return one_process_ops(video, text)
        plan.pack(video)  # builds (and caches) the layout over the plan's groups
        layout = plan.packed_layout()
        local = plan.local_segments()
        plan.pack(None)  # the plan's unpacked calls stay unpacked; the closures below hold the layout
        text_segments = tuple(n for length in text.lengths for n in (length, 0))
        groups = (plan.ulysses_group, plan.ring_group)
        return PackedOps(
            split=lambda x, dim: split_packed(x, dim, layout, *groups, plan.layout),
            gather=lambda x, dim, total: gather_packed(x, dim, layout, *groups, plan.layout),
            # q, k, v: tensors or projections (mm_parallel.ulysses); under features.compile the projections
            # handed over run with the attention, outside the compiled block
            self_attention=takes_projections(
                outside_compile(
                    lambda q, k, v: usp_attention(
                        q,
                        k,
                        v,
                        *groups,
                        False,
                        plan.layout,
                        packed=layout,
                        overlap_heads=plan.overlap_heads,
                        overlap_projections=plan.overlap_projections,
                    )  # fmt: skip
                )
            ),
            cross_attention=outside_compile(lambda q, k, v: packed_attention(q, k, v, local, text_segments)),
        )

    return ops


def _per_sample_timesteps(timesteps: torch.Tensor | Sequence[torch.Tensor], count: int) -> list[torch.Tensor]:
    if isinstance(timesteps, torch.Tensor):
        if timesteps.ndim != 1 or timesteps.numel() != count:
            raise ValueError(
                f"packed forward: timestep must be [{count}] (one per sample), got {list(timesteps.shape)}"
            )
        return list(timesteps.unbind(0))
    timesteps = list(timesteps)
    if len(timesteps) != count:
        raise ValueError(f"packed forward: {len(timesteps)} timesteps for {count} samples")
    return [torch.as_tensor(t) for t in timesteps]


def packed_forward(
    model: torch.nn.Module,
    latents: Sequence[torch.Tensor],
    timesteps: torch.Tensor | Sequence[torch.Tensor],
    texts: Sequence[torch.Tensor],
    ops_fn: PackingFn,
) -> list[torch.Tensor]:
    """The velocity of every sample, as ``model`` (a ``WanDiT``) predicts it for that sample alone.

    Args:
        latents: per sample ``[in_dim, F_i, H_i, W_i]`` (each divisible by the patch size).
        timesteps: ``[N]``, or per sample a scalar or its ``[S_i]`` per-token timesteps (TI2V).
        texts: per sample ``[L_i, text_dim]`` text embeddings.
        ops_fn: the packing seam (:func:`one_process_ops` / :func:`context_parallel_ops`).

    Returns:
        per sample ``[out_dim, F_i, H_i, W_i]``.
    """
    config = model.config
    if not latents or len(texts) != len(latents):
        raise ValueError(
            f"packed forward: {len(latents)} latents and {len(texts)} texts; need one text per sample"
        )
    pt, ph, pw = config.patch_size
    grids = []
    for i, latent in enumerate(latents):
        if latent.ndim != 4:
            raise ValueError(
                f"packed forward: sample {i}'s latent must be [C, F, H, W], got {list(latent.shape)}"
            )
        f, h, w = latent.shape[1:]
        if f % pt or h % ph or w % pw:
            raise ValueError(
                f"packed forward: sample {i}'s latent F, H, W = {(f, h, w)} is not divisible by {(pt, ph, pw)}"
            )
        grids.append((f // pt, h // ph, w // pw))
    video = PackedSequence(tuple(math.prod(g) for g in grids))
    text = PackedSequence(tuple(t.shape[0] for t in texts))
    times = _per_sample_timesteps(timesteps, len(latents))
    for i, (t, n) in enumerate(zip(times, video.lengths, strict=True)):
        if t.ndim and t.numel() != n:
            raise ValueError(
                f"packed forward: sample {i}'s per-token timestep has {t.numel()} tokens, its latent {n}"
            )
    ops = ops_fn(video, text)
    dtype = texts[0].dtype

    # 1. Patch each sample, concatenate; RoPE tables of each grid; each sample's time and text
    x = torch.cat([model.patch_embedding(z[None]).flatten(2).transpose(1, 2) for z in latents], dim=1)
    tables = [
        rope_cos_sin(
            g, config.head_dim, theta=config.rope_theta, max_seq_len=config.rope_max_seq_len, device=x.device
        )
        for g in grids
    ]
    rope = (torch.cat([c for c, _ in tables]), torch.cat([s for _, s in tables]))
    if all(t.ndim == 0 for t in times):  # embed once per sample, then expand over its tokens
        temb, e = model._embed_time(torch.stack(times).to(x.device)[None], dtype)
        counts = torch.tensor(video.lengths, device=x.device)
        temb, e = temb.repeat_interleave(counts, dim=1), e.repeat_interleave(counts, dim=1)
    else:
        per_token = torch.cat([t.reshape(-1).expand(n) for t, n in zip(times, video.lengths, strict=True)])
        temb, e = model._embed_time(per_token.to(x.device)[None], dtype)
    context = model.text_embedding(torch.cat(list(texts))[None])  # 1, L_0 + L_1 + ..., dim

    # 2. Split (every sample on its own over the ring), 3. blocks, 4. head and gather
    x, temb, e = ops.split(x, 1), ops.split(temb, 1), ops.split(e, 1)
    rope = (ops.split(rope[0], 0), ops.split(rope[1], 0))
    for block in model.blocks:
        x = block(x, context, e, rope, ops.self_attention, ops.cross_attention)
    x = ops.gather(model.head(x, temb), 1, video.total)  # 1, S, out_dim * patch

    outputs = []
    for tokens, (gf, gh, gw) in zip(video.unpack(x, 1), grids, strict=True):
        y = tokens.reshape(gf, gh, gw, pt, ph, pw, config.out_dim).permute(6, 0, 3, 1, 4, 2, 5)
        outputs.append(y.reshape(config.out_dim, gf * pt, gh * ph, gw * pw))
    return outputs
