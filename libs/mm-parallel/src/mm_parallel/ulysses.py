"""Ulysses (DeepSpeed-style) sequence parallel attention: all-to-all sequence <-> heads.

Each rank holds ``[B, S/P, H, D]``; an all-to-all gives it ``[B, S, H/P, D]`` (the full
sequence for ``H/P`` heads), attention runs locally, and the inverse all-to-all restores
``[B, S/P, H, D]``. The full sequence after the all-to-all is the concatenation of the ranks'
local sequences, i.e. global order for the ``contiguous`` split layout: use that layout for
causal attention or position-dependent masks (non-causal attention without a mask is order
independent, so any layout works).

The all-to-alls are torch's functional collectives (:mod:`mm_parallel._comm`), so a compiled block
traces Ulysses attention whole: no graph break.

Overlap with the attention (``overlap_heads=G``): the heads are cut into ``G`` groups; every group's
three all-to-alls are started at once, and group ``g``'s attention runs while the all-to-alls of groups
``g+1, ...`` are in flight, its output's all-to-all back while the next group computes.

Overlap with the projections (``overlap_projections=True``): q, k and v may be given as projections,
zero-argument callables returning ``[B, S/P, H, D]`` (:data:`Project`; :func:`takes_projections` marks the
attention functions that accept them). q is projected and its all-to-all started, k is projected while
q's is in flight, then v; attention waits for the three. A projection needs only this rank's tokens
with all their heads, which every rank holds before the all-to-all: Wan2.2's and LTX-2's RMSNorm of q
and k over all heads together and RoPE are per token, so they are part of the projection. With
``G > 1`` as well, each projection's all-to-all is started in ``G`` head groups and the attention runs
group by group as above.

Both keep every operation of the synchronous path (heads are independent; the order in which
independent tensors are computed changes no value), so the result is bitwise the same forward and
backward; the backward runs the transposed all-to-alls without overlap (the functional collective's
backward waits at once). ``None`` takes the device's measured default (:data:`OVERLAP_HEADS_DEFAULT`
where the heads divide, :data:`OVERLAP_PROJECTIONS_DEFAULT`).

Packed sequences (``packed=``): the ring-local sequence after the all-to-all is the whole packed
sequence (:class:`mm_parallel.PackedLayout`, no ring), and attention stays inside each sample.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import Tensor
from torch.distributed import ProcessGroup

from mm_parallel._comm import (
    all_gather_no_grad,
    all_to_all,
    check_all_to_all,
    finish_all_to_all,
    group_rank,
    group_size,
    start_all_to_all,
)
from mm_parallel.attention_backends import attention, combine_masks, key_padding_to_attn_mask
from mm_parallel.packing import Packing, packed_layout
from mm_parallel.ring import packed_ring_attention

AttnFn = Callable[..., Tensor]
Attend = Callable[[Tensor, Tensor, Tensor], Tensor]
Project = Callable[[], Tensor]
"""A projection of this rank's tokens: called once, returns ``[B, S/P, H, D]`` with all heads."""
F = TypeVar("F", bound=Callable[..., Tensor])

#: ``overlap_heads`` when a call leaves it ``None``, per device type: the faster of off (1) and on, measured
#: with ``benchmarks/cp_attention.py --overlap`` (CPU, benchmarks/README.md: the layer stack's fastest
#: training step with 2 groups 0.64x-1.00x of off's in 4 runs, medians within noise; the forward up to 6%
#: faster in the steadiest run) and ``benchmarks/device_check.sh``
#: stage 5 (GPU: not run yet, so off); a device type not listed runs without overlap. Only Ulysses without a
#: ring takes it (USP with a ring was not measured: off unless asked).
OVERLAP_HEADS_DEFAULT: dict[str, int] = {"cpu": 2, "cuda": 1, "npu": 1}

#: ``overlap_projections`` when a call leaves it ``None``, per device type, measured like
#: :data:`OVERLAP_HEADS_DEFAULT` (``benchmarks/cp_attention.py --overlap 1 2 p1 p2``; CPU,
#: benchmarks/README.md: no consistent gain in 3 runs, within 1.5% of the same head groups without it in the
#: steady one, so off; GPU: ``device_check.sh`` stage 5, not run yet, so off). Only Ulysses without a ring
#: takes it by default.
OVERLAP_PROJECTIONS_DEFAULT: dict[str, bool] = {"cpu": False, "cuda": False, "npu": False}


@dataclass(frozen=True)
class UlyssesOverlap:
    """How a run's Ulysses all-to-alls overlap compute (module doc); ``None`` = the device's default.

    Attributes:
        heads: head groups pipelined against the attention (``overlap_heads``; 1 = off).
        projections: each projection's all-to-all started before the next projection (``overlap_projections``).
    """

    heads: int | None = None
    projections: bool | None = None

    def __post_init__(self) -> None:
        if self.heads is not None and (isinstance(self.heads, bool) or self.heads < 1):
            raise ValueError(
                f"UlyssesOverlap.heads must be a positive number of head groups or None, got {self.heads}"
            )


def takes_projections(fn: F) -> F:
    """Mark ``fn`` as an attention function whose q, k and v may be projections (:data:`Project`): a model
    that finds ``fn.takes_projections`` passes them uncomputed, so their all-to-alls overlap the next one."""
    fn.takes_projections = True  # type: ignore[attr-defined]
    return fn


def resolve_overlap_projections(requested: bool | None, world: int, device_type: str) -> bool:
    """Whether a Ulysses call starts each projection's all-to-all before the next projection (module
    doc): ``None`` = the device's default (:data:`OVERLAP_PROJECTIONS_DEFAULT`); never without Ulysses."""
    if world == 1:
        return False
    return OVERLAP_PROJECTIONS_DEFAULT.get(device_type, False) if requested is None else requested


def projected(q: Tensor | Project, k: Tensor | Project, v: Tensor | Project) -> tuple[Tensor, Tensor, Tensor]:
    """q, k and v computed, in that order (projections called, tensors kept)."""
    return tuple(t() if callable(t) else t for t in (q, k, v))  # type: ignore[return-value]


def check_heads_divisible(heads: int, world: int, what: str = "ulysses") -> None:
    """Raise a clear error if ``heads`` cannot be split over ``world`` ranks."""
    if heads % world:
        raise ValueError(
            f"{what}: {heads} attention heads are not divisible by the ulysses group size {world}; "
            f"choose ulysses_parallel_size dividing {heads}"
        )


def seq_to_heads(x: Tensor, group: ProcessGroup | None) -> Tensor:
    """``[B, S/P, H, D]`` -> ``[B, S, H/P, D]`` (autograd-aware all-to-all)."""
    return all_to_all(x, scatter_dim=2, gather_dim=1, group=group)


def heads_to_seq(x: Tensor, group: ProcessGroup | None) -> Tensor:
    """``[B, S, H/P, D]`` -> ``[B, S/P, H, D]`` (inverse of :func:`seq_to_heads`)."""
    return all_to_all(x, scatter_dim=1, gather_dim=2, group=group)


def gather_key_padding_mask(key_padding_mask: Tensor | None, group: ProcessGroup | None) -> Tensor | None:
    """Concatenate the ranks' local ``[B, S/P]`` key padding masks into ``[B, S]`` (no gradient)."""
    if key_padding_mask is None or group_size(group) == 1:
        return key_padding_mask
    return all_gather_no_grad(key_padding_mask, group, dim=1)  # type: ignore[arg-type]


def resolve_overlap_heads(
    requested: int | None, heads: int, world: int, device_type: str, per_head_mask: bool = False
) -> int:
    """The number of head groups a Ulysses call pipelines (1 = no overlap).

    ``None``: the device's default (:data:`OVERLAP_HEADS_DEFAULT`) when ``heads`` divide by it times the
    group size, else 1. An explicit value must divide: ``heads % (overlap_heads * world) == 0``.
    """
    if world == 1:
        return 1
    if requested is None:
        groups = OVERLAP_HEADS_DEFAULT.get(device_type, 1)
        return groups if heads % (groups * world) == 0 and not per_head_mask else 1
    if requested < 1:
        raise ValueError(f"overlap_heads must be a positive number of head groups, got {requested}")
    if heads % (requested * world):
        raise ValueError(
            f"overlap_heads={requested}: {heads} attention heads do not split into {requested} groups over "
            f"ulysses {world} (heads must divide by overlap_heads x ulysses = {requested * world})"
        )
    if requested > 1 and per_head_mask:
        raise ValueError(
            "overlap_heads > 1 takes no per-head attn_mask (a head dim > 1); pass overlap_heads=1"
        )
    return requested


def _attend_groups(started: Iterable[Sequence[Tensor]], group: ProcessGroup | None, attend: Attend) -> Tensor:
    """Each head group's attention as soon as its q, k, v all-to-alls arrive, its output's all-to-all back
    started while the next group computes; the groups' outputs concatenated over the heads."""
    back = [start_all_to_all(attend(*(finish_all_to_all(t, 1) for t in trio)), 1, group) for trio in started]  # type: ignore[arg-type]
    return torch.cat([finish_all_to_all(t, 2) for t in back], dim=2)


def heads_pipeline(
    q: Tensor, k: Tensor, v: Tensor, group: ProcessGroup | None, attend: Attend, groups: int
) -> Tensor:
    """``attend`` over the full sequence for this rank's heads, between the two all-to-alls, in ``groups``
    pipelined head groups (module doc); ``[B, S/P, H, D]`` in and out."""
    if group_size(group) == 1:
        return attend(q, k, v)
    if groups == 1:
        return heads_to_seq(attend(*(seq_to_heads(t, group) for t in (q, k, v))), group)
    started = [  # every group's all-to-alls in flight; each group waits for its own only
        [start_all_to_all(t, 2, group) for t in trio]  # type: ignore[arg-type]
        for trio in zip(q.chunk(groups, 2), k.chunk(groups, 2), v.chunk(groups, 2), strict=True)
    ]
    return _attend_groups(started, group, attend)


def projections_pipeline(
    q: Tensor | Project, k: Tensor | Project, v: Tensor | Project, group: ProcessGroup, attend: Attend,
    groups: int,
) -> Tensor:  # fmt: skip
    """:func:`heads_pipeline` whose q, k, v are projected one after the other, each one's all-to-all (in
    ``groups`` head groups) started before the next is projected (module doc)."""
    per_projection = []
    for project in (q, k, v):
        x = project() if callable(project) else project
        check_all_to_all(x, 2, group)
        per_projection.append([start_all_to_all(c, 2, group) for c in x.chunk(groups, 2)])
    return _attend_groups(zip(*per_projection, strict=True), group, attend)


def ulysses_pipeline(
    q: Tensor | Project, k: Tensor | Project, v: Tensor | Project, group: ProcessGroup | None,
    attend: Callable[[int], Attend], overlap_heads: int | None, overlap_projections: bool | None,
    per_head_mask: bool = False,
) -> Tensor:  # fmt: skip
    """The Ulysses all-to-alls around ``attend(heads)`` (``heads``: the full head count), overlapped as
    asked (module doc): q, k, v tensors or projections; ``[B, S/P, H, D]`` in and out."""
    world = group_size(group)
    q = q() if callable(q) else q  # the head count and device come from q
    check_heads_divisible(q.size(2), world)
    groups = resolve_overlap_heads(overlap_heads, q.size(2), world, q.device.type, per_head_mask)
    if resolve_overlap_projections(overlap_projections, world, q.device.type):
        return projections_pipeline(q, k, v, group, attend(q.size(2)), groups)  # type: ignore[arg-type]
    return heads_pipeline(*projected(q, k, v), group, attend(q.size(2)), groups)


def _local_heads_mask(attn_mask: Tensor | None, heads: int, group: ProcessGroup | None) -> Tensor | None:
    """Keep this rank's heads of a full-head ``[B, H, S, S]`` mask (broadcast head dims pass through)."""
    if attn_mask is None or attn_mask.dim() < 3 or attn_mask.size(-3) == 1:
        return attn_mask
    world = group_size(group)
    if attn_mask.size(-3) != heads * world:
        raise ValueError(
            f"attn_mask head dim {attn_mask.size(-3)} is neither 1 nor the number of heads {heads * world}"
        )
    return attn_mask.chunk(world, dim=-3)[group_rank(group)]


@takes_projections
def ulysses_attention(
    q: Tensor | Project,
    k: Tensor | Project,
    v: Tensor | Project,
    group: ProcessGroup | None,
    attn_fn: AttnFn | None = None,
    attn_mask: Tensor | None = None,
    *,
    key_padding_mask: Tensor | None = None,
    packed: Packing | None = None,
    overlap_heads: int | None = None,
    overlap_projections: bool | None = None,
    **kw: object,
) -> Tensor:
    """Attention over the full sequence held as ``[B, S/P, H, D]`` shards on ``group``.

    Args:
        q, k, v: local ``[batch, local_seq, heads, head_dim]``; ``heads`` divisible by the group size; or
            projections returning them (:data:`Project`, called once each, q first).
        group: the ulysses process group; ``None`` or size 1 = plain attention.
        attn_fn: ``attn_fn(q, k, v, attn_mask=..., **kw)`` on ``[B, S, H/P, D]``; default
            :func:`mm_parallel.attention` (torch SDPA), which takes ``causal=`` and ``scale=``.
        attn_mask: mask over the FULL sequence, broadcastable to ``[B, H, S, S]`` (bool True =
            attend, or additive float); a head dim of size ``H`` is sliced to this rank's heads.
        key_padding_mask: local ``[B, S/P]`` bool, True = real token (split like q/k/v); it is
            gathered and folded into the ``attn_mask`` handed to ``attn_fn``.
        packed: the full sequence is this packing of samples, split with :func:`mm_parallel.split_packed`
            over this group; attention stays inside each sample (the packed kernels; no ``attn_fn``,
            mask or causal; ``scale=`` is taken).
        overlap_heads: head groups whose all-to-alls overlap the other groups' attention (module doc);
            1 = off, ``None`` = the device's default.
        overlap_projections: start each projection's all-to-all before the next projection (module doc);
            ``None`` = the device's default.
        **kw: passed to ``attn_fn`` (e.g. ``causal=True``, ``scale=0.1``).

    Returns:
        ``[batch, local_seq, heads, head_dim]``.
    """
    world = group_size(group)
    per_head = attn_mask is not None and attn_mask.dim() >= 3 and attn_mask.size(-3) > 1
    if packed is not None:
        if attn_fn is not None or attn_mask is not None or key_padding_mask is not None or kw.get("causal"):
            raise ValueError(
                "ulysses_attention: packed attention takes no attn_fn, attn_mask, key_padding_mask or causal"
            )
        lay = packed_layout(packed, 1, world, "contiguous")
        scale = kw.get("scale")

        def packed_attend(heads: int) -> Attend:
            return lambda q, k, v: packed_ring_attention(q, k, v, None, lay, lay, scale=scale)  # type: ignore[arg-type]

        return ulysses_pipeline(q, k, v, group, packed_attend, overlap_heads, overlap_projections)
    fn = attn_fn or attention
    kpm = gather_key_padding_mask(key_padding_mask, group)

    def attend(heads: int) -> Attend:  # attention over the full sequence for this rank's heads
        mask = _local_heads_mask(attn_mask, heads // world, group)
        if kpm is not None:
            mask = combine_masks(mask, key_padding_to_attn_mask(kpm))
        return lambda q, k, v: fn(q, k, v, attn_mask=mask, **kw)

    # [B, S/P, H, D] -> [B, S, H/P, D]; attention over the full sequence for this rank's heads; back
    return ulysses_pipeline(q, k, v, group, attend, overlap_heads, overlap_projections, per_head)
