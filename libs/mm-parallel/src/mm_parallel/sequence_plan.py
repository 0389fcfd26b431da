"""The sequence-parallel plan of one model: split its token streams, attend over them, gather them back.

A model that runs sequence parallel (context parallel) over Ulysses x Ring (USP) needs three
callables that share one forward's state:

1. ``split(x, dim, stream)`` before the blocks: this rank's share of a full token stream
   (:func:`~mm_parallel.split_for_usp`, the end zero-padded to :meth:`SequenceParallelPlan.padded_length`).
   The split remembers the stream's real token count; every tensor of one stream (tokens, RoPE
   tables, per-token timesteps) is split through it.
2. ``attention(q, k, v, key_stream=...)`` inside the blocks: :func:`~mm_parallel.usp_attention`,
   told the key stream's real token count (``key_len``) when the split padded it, so ring blocks
   are cut to their real keys and no mask is gathered.
3. ``gather(x, dim, length)`` after the blocks: :func:`~mm_parallel.gather_for_usp`, padding dropped.

:meth:`SequenceParallelPlan.valid_mask` gives this rank's ``[S_local]`` mask of real tokens (True)
for the last split of a stream, for per-token work on the shards (a local loss, a kernel that takes
a key padding mask). Split and gather are the exact adjoints of :mod:`mm_parallel.sequence`, so the
mean of the per-rank gradients over the context-parallel group is the one-process gradient.

Heads must divide by the Ulysses size: the config check says so before a run, and the Ulysses
all-to-all (:func:`mm_parallel.ulysses.check_heads_divisible`) at the first attention.

Packed streams: :meth:`SequenceParallelPlan.pack` tells the plan that a stream is several samples
concatenated (:class:`mm_parallel.PackedSequence`, e.g. from the batch's ``cu_seqlens``). Until it is
packed anew or unpacked, ``split`` / ``gather`` of that stream split every sample over the ring and
cut the result over Ulysses (:class:`mm_parallel.PackedLayout`), and ``attention`` keeps each sample
to itself: the model's calls stay the same.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.distributed import ProcessGroup

from mm_parallel._comm import group_rank, group_size
from mm_parallel.packed_split import gather_packed, layout_for, split_packed
from mm_parallel.packing import PackedLayout, PackedSequence
from mm_parallel.parallel_state import ParallelState
from mm_parallel.sequence import (
    Layout,
    _check_layout,
    gather_for_usp,
    real_token_counts,
    split_for_usp,
    usp_padded_length,
)
from mm_parallel.ulysses import Project, UlyssesOverlap, takes_projections
from mm_parallel.usp import usp_attention

#: The stream name of a model with one token sequence.
TOKENS = "tokens"


class SequenceParallelPlan:
    """Split / attention / gather of a model's token streams over the Ulysses and Ring groups.

    Args:
        ulysses_group: the Ulysses (all-to-all over heads) group; ``None`` or size 1 = off.
        ring_group: the Ring (KV passed around) group; ``None`` or size 1 = off.
        layout: the ring split layout (``"zigzag"`` balances causal work; ``"contiguous"`` keeps a
            rank's tokens in one piece).
        overlap_heads: Ulysses head groups whose all-to-alls overlap the other groups' attention
            (:mod:`mm_parallel.ulysses`): 1 = off, ``None`` = the device's measured default.
        overlap_projections: start each projection's Ulysses all-to-all before the next projection
            (``attention`` given projections, :mod:`mm_parallel.ulysses`); ``None`` = the device's default.

    With both groups off every method is the identity / plain attention, so a model can always
    call the plan.
    """

    def __init__(
        self,
        ulysses_group: ProcessGroup | None = None,
        ring_group: ProcessGroup | None = None,
        layout: Layout = "contiguous",
        *,
        overlap_heads: int | None = None,
        overlap_projections: bool | None = None,
    ) -> None:
        _check_layout(layout)
        if overlap_heads is not None and overlap_heads < 1:
            raise ValueError(
                f"overlap_heads must be a positive number of head groups or None, got {overlap_heads}"
            )
        self.overlap_projections = overlap_projections
        self.ulysses_group = ulysses_group if group_size(ulysses_group) > 1 else None
        self.ring_group = ring_group if group_size(ring_group) > 1 else None
        self.layout: Layout = layout
        self.overlap_heads = overlap_heads
        #: Real token count of each stream's last split (padding excluded).
        self.lengths: dict[str, int] = {}
        self._key_lens: dict[str, int | None] = {}
        self._packing: dict[str, PackedLayout] = {}

    @classmethod
    def from_parallel_state(
        cls,
        parallel_state: ParallelState,
        layout: Layout = "contiguous",
        *,
        overlap: UlyssesOverlap | None = None,
    ) -> SequenceParallelPlan:
        """The plan over ``parallel_state``'s Ulysses and Ring groups, overlapped as ``overlap`` says
        (default: the state's ``ulysses_overlap``)."""
        ulysses = parallel_state.ulysses_group if parallel_state.ulysses_size > 1 else None
        ring = parallel_state.ring_group if parallel_state.ring_size > 1 else None
        overlap = parallel_state.ulysses_overlap if overlap is None else overlap
        return cls(
            ulysses, ring, layout, overlap_heads=overlap.heads, overlap_projections=overlap.projections
        )

    # ------------------------------------------------------------------ packing
    def pack(self, packed: PackedSequence | None, stream: str = TOKENS) -> None:
        """From now on ``stream`` is ``packed`` (several samples concatenated); ``None`` unpacks it.

        Call it outside compiled code (the trainer, per micro-batch): it builds the stream's
        :class:`mm_parallel.PackedLayout` here, so compiled blocks only read it.
        """
        if packed is None:
            self._packing.pop(stream, None)
        elif not isinstance(packed, PackedSequence):
            raise TypeError(
                f"SequenceParallelPlan.pack: expected a PackedSequence or None, got {type(packed).__name__}"
            )
        else:
            self._packing[stream] = layout_for(packed, self.ulysses_group, self.ring_group, self.layout)

    def packing(self, stream: str = TOKENS) -> PackedSequence | None:
        """``stream``'s packing, or None when it is one sequence."""
        lay = self._packing.get(stream)
        return None if lay is None else lay.packed

    def packed_layout(self, stream: str = TOKENS) -> PackedLayout:
        """Where ``stream``'s packed tokens lie across this plan's ranks (it must be packed)."""
        lay = self._packing.get(stream)
        if lay is None:
            raise KeyError(f"SequenceParallelPlan: stream {stream!r} is not packed (call pack first)")
        return lay

    def local_segments(self, stream: str = TOKENS) -> tuple[int, ...]:
        """This rank's segment lengths of packed ``stream``: ``real_0, pad_0, real_1, pad_1, ...``
        (:meth:`mm_parallel.PackedLayout.local_segments`)."""
        return self.packed_layout(stream).local_segments(
            group_rank(self.ring_group), group_rank(self.ulysses_group)
        )

    # ------------------------------------------------------------------ sizes
    @property
    def ulysses_size(self) -> int:
        return group_size(self.ulysses_group)

    @property
    def ring_size(self) -> int:
        return group_size(self.ring_group)

    @property
    def size(self) -> int:
        """Ranks a sequence is split over (ulysses x ring)."""
        return self.ulysses_size * self.ring_size

    @property
    def enabled(self) -> bool:
        """Whether the sequence is split at all (``size > 1``)."""
        return self.size > 1

    @property
    def multiple(self) -> int:
        """Token counts that split without padding are the multiples of this."""
        return usp_padded_length(1, self.ulysses_group, self.ring_group, self.layout)

    def padded_length(self, length: int) -> int:
        """The length a stream of ``length`` tokens has after the split's zero padding."""
        return usp_padded_length(length, self.ulysses_group, self.ring_group, self.layout)

    def key_len(self, stream: str = TOKENS) -> int | None:
        """The real token count of ``stream``'s last split when it was padded, else None."""
        return self._key_lens.get(stream)

    # ------------------------------------------------------- split / gather
    def split(self, x: Tensor, dim: int, stream: str = TOKENS) -> Tensor:
        """This rank's zero-padded share of the full ``stream`` tensor ``x`` along ``dim`` (a packed
        stream: :func:`mm_parallel.split_packed`)."""
        length = x.size(dim)
        self.lengths[stream] = length
        packed = self._packing.get(stream)
        if packed is not None:
            self._key_lens[stream] = None
            return split_packed(x, dim, packed, self.ulysses_group, self.ring_group, self.layout)
        # set here, outside any compiled block: attention only looks it up
        self._key_lens[stream] = None if length == self.padded_length(length) else length
        return split_for_usp(x, dim, self.ulysses_group, self.ring_group, self.layout, pad=True)

    def gather(self, x: Tensor, dim: int, length: int, stream: str = TOKENS) -> Tensor:
        """The full tensor along ``dim`` on every rank, ``length`` long (the split's padding dropped; a
        packed ``stream``: :func:`mm_parallel.gather_packed`, ``length`` its total)."""
        lay = self._packing.get(stream)
        if lay is None:
            return gather_for_usp(x, dim, self.ulysses_group, self.ring_group, self.layout, seq_len=length)
        if length != lay.packed.total:
            raise ValueError(
                f"SequenceParallelPlan.gather: stream {stream!r} is packed to {lay.packed.total} tokens, asked "
                f"for {length}"
            )
        return gather_packed(x, dim, lay, self.ulysses_group, self.ring_group, self.layout)

    def valid_mask(self, stream: str = TOKENS, device: torch.device | str | None = None) -> Tensor:
        """``[S_local]`` bool: which of this rank's tokens of ``stream``'s last split are real.

        A rank's real tokens are its first ones in both layouts (the padding is the end of the
        full sequence), so the mask is a prefix: host arithmetic, no communication. A packed stream's
        padding ends each of its samples: the mask has a gap after every sample's share.
        """
        if stream not in self.lengths:
            raise KeyError(f"SequenceParallelPlan.valid_mask: stream {stream!r} was not split yet")
        if stream in self._packing:
            valid = self.packed_layout(stream).local_valid(
                group_rank(self.ring_group), group_rank(self.ulysses_group)
            )
            return valid.to(device)
        length = self.lengths[stream]
        ring_local = self.padded_length(length) // self.ring_size
        ring_real = real_token_counts(length, ring_local, self.ring_size, self.layout)[
            group_rank(self.ring_group)
        ]
        local = ring_local // self.ulysses_size
        counts = real_token_counts(ring_real, local, self.ulysses_size, "contiguous")
        return torch.arange(local, device=device) < counts[group_rank(self.ulysses_group)]

    # ---------------------------------------------------------------- attention
    @takes_projections
    def attention(
        self, q: Tensor | Project, k: Tensor | Project, v: Tensor | Project, *, key_stream: str = TOKENS,
        causal: bool = False, query_stream: str | None = None,
    ) -> Tensor:  # fmt: skip
        """USP attention of local ``[B, S_local, H, D]`` queries over the split ``key_stream``.

        q, k, v may be projections returning them (their all-to-alls overlap the next projection when
        ``overlap_projections`` says so). A packed ``key_stream`` keeps every sample to itself; its queries
        are packed like the keys, or like ``query_stream`` when given (cross-attention between two packed
        streams of the same samples).
        """
        packed = self._packing.get(key_stream)
        query_packed = None if query_stream is None else self._packing.get(query_stream)
        return usp_attention(
            q,
            k,
            v,
            self.ulysses_group,
            self.ring_group,
            causal,
            self.layout,
            key_len=None if packed is not None else self._key_lens.get(key_stream),
            packed=packed,
            query_packed=query_packed if packed is not None else None,
            overlap_heads=self.overlap_heads,
            overlap_projections=self.overlap_projections,
        )

    def __repr__(self) -> str:
        return (
            f"SequenceParallelPlan(ulysses={self.ulysses_size}, ring={self.ring_size}, "
            f"layout={self.layout!r}, overlap_heads={self.overlap_heads}, "
            f"overlap_projections={self.overlap_projections})"
        )
