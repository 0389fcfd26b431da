"""Packed (variable-length) sequences and where their tokens lie across the context-parallel ranks.

A packed sequence is several samples of different lengths concatenated into one token sequence (one
micro-batch row); attention is restricted to each sample (block-diagonal). :class:`PackedSequence`
describes it by its per-sample lengths, with flash-attn's cumulative form (``cu_seqlens``) as a view.

The split over Ring x Ulysses (:class:`PackedLayout`, host arithmetic only):

- **Ring: every sample is split on its own** with the ring ``layout`` (``contiguous`` or ``zigzag``),
  so every ring rank holds ``1/R`` of every sample. A ring rank's attention work is the sum over
  samples of (its queries of the sample) x (the sample's keys), so equal shares of every sample give
  every rank the same work (and zigzag balances causal work inside a sample, as for one sequence).
  Splitting the concatenation instead would give some ranks whole short samples and others parts of
  a long one: unequal work, and most ring steps would meet no key of their queries' samples.
  Each sample is zero-padded at its end to a multiple of the ring's chunk count (``2R`` for zigzag,
  ``R`` for contiguous; no padding without a ring).
- **Ulysses: the ring-local sequence (rank r's share of every sample, in sample order) is cut into U
  contiguous pieces**, as for one sequence. After the Ulysses all-to-all every Ulysses rank holds the
  whole ring-local sequence for ``H/U`` heads, so its attention work does not depend on which tokens
  it held; the contiguous cut gives every rank the same token count for the per-token work (norms,
  MLP) and keeps each sample contiguous after the all-to-all (the varlen kernels need that).
  The last sample's padding is extended so that the total splits over Ulysses too.

Padding tokens are segments of their own: sample ``i`` becomes a real segment and a pad segment (often
empty), so a real token never attends to padding, and no kernel needs a mask. After the split, ring
rank ``r`` holds, for every sample, its real tokens first and then its pad tokens (a sample's padding is
its end, and a rank's positions inside a sample increase with its local index in both layouts): its
local segments are ``real_0, pad_0, real_1, pad_1, ...`` (:meth:`PackedLayout.ring_segments`), paired
by index with any other rank's.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate

import torch
from torch import Tensor

from mm_parallel.sequence import Layout, _check_layout, num_chunks, rank_chunk_ids, real_token_counts


@dataclass(frozen=True)
class PackedSequence:
    """Samples of ``lengths`` tokens concatenated along the sequence dimension, in this order.

    Every batch row of a ``[B, T, ...]`` tensor shares the packing (a packed micro-batch is one row).
    """

    lengths: tuple[int, ...]

    def __post_init__(self) -> None:
        lengths = tuple(self.lengths)
        if not lengths:
            raise ValueError("PackedSequence: at least one sample is needed, got no lengths")
        bad = [
            (i, n) for i, n in enumerate(lengths) if not isinstance(n, int) or isinstance(n, bool) or n < 1
        ]
        if bad:
            raise ValueError(
                f"PackedSequence: every sample needs a positive int length; (index, length): {bad}"
            )
        object.__setattr__(self, "lengths", lengths)

    @classmethod
    def from_lengths(cls, lengths: Iterable[int]) -> PackedSequence:
        """From per-sample token counts (python ints or a 1-D integer tensor)."""
        if isinstance(lengths, Tensor):
            lengths = lengths.tolist()
        return cls(tuple(int(n) for n in lengths))

    @classmethod
    def from_cu_seqlens(cls, cu_seqlens: Tensor | Sequence[int]) -> PackedSequence:
        """From flash-attn's cumulative lengths ``[0, l0, l0 + l1, ...]`` (strictly increasing, from 0)."""
        cu = cu_seqlens.tolist() if isinstance(cu_seqlens, Tensor) else list(cu_seqlens)
        if len(cu) < 2 or cu[0] != 0:
            raise ValueError(f"cu_seqlens must start at 0 and hold at least one sample, got {cu}")
        return cls(tuple(int(b - a) for a, b in zip(cu[:-1], cu[1:], strict=True)))

    @property
    def num_samples(self) -> int:
        return len(self.lengths)

    @property
    def total(self) -> int:
        """Tokens of the packed sequence."""
        return sum(self.lengths)

    @property
    def max_len(self) -> int:
        return max(self.lengths)

    @property
    def offsets(self) -> tuple[int, ...]:
        """Where each sample starts."""
        return (0, *accumulate(self.lengths))[:-1]

    def cu_seqlens(
        self, device: torch.device | str | None = None, dtype: torch.dtype = torch.int32
    ) -> Tensor:
        """``[num_samples + 1]`` cumulative lengths from 0 (flash-attn's ``cu_seqlens``)."""
        return torch.tensor((0, *accumulate(self.lengths)), dtype=dtype, device=device)

    def segment_ids(self, device: torch.device | str | None = None) -> Tensor:
        """``[total]`` int64: the sample index of every token."""
        counts = torch.tensor(self.lengths, device=device)
        return torch.repeat_interleave(torch.arange(self.num_samples, device=device), counts)

    def unpack(self, x: Tensor, dim: int) -> list[Tensor]:
        """The samples of packed ``x`` along ``dim`` (views)."""
        self.check(x, dim, "unpack")
        return [x.narrow(dim, start, n) for start, n in zip(self.offsets, self.lengths, strict=True)]

    @classmethod
    def pack(cls, samples: Sequence[Tensor], dim: int) -> tuple[Tensor, PackedSequence]:
        """Concatenate ``samples`` along ``dim``: the packed tensor and its :class:`PackedSequence`."""
        return torch.cat(list(samples), dim=dim), cls(tuple(s.size(dim) for s in samples))

    def check(self, x: Tensor, dim: int, what: str) -> None:
        """Raise unless ``x`` has ``total`` tokens along ``dim``."""
        if x.size(dim) != self.total:
            raise ValueError(
                f"{what}: dim {dim} has {x.size(dim)} tokens, the packed sequence {self.num_samples} samples "
                f"of {self.total} tokens ({list(self.lengths)})"
            )


@dataclass(frozen=True)
class PackedLayout:
    """Where the tokens of ``packed`` lie after the split over ``ring`` x ``ulysses`` ranks (module doc).

    Positions are numbered in **CP order**: the ranks' local shards concatenated ring-major
    (``cp_rank = ring_rank * ulysses + ulysses_rank``), what a ``contiguous`` gather over Ulysses
    then Ring returns. A position holds an original token index, or ``packed.total`` for padding.
    """

    packed: PackedSequence
    ring: int = 1
    ulysses: int = 1
    layout: Layout = "contiguous"
    #: Each sample's length after its end padding: a multiple of :attr:`chunks`; the last one longer so
    #: that the total is a multiple of ``chunks * ulysses``.
    padded_lengths: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _ring_segments: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)
    #: ``[padded_total]`` int64 (CPU): the original token at each CP-order position (``total`` = pad).
    sources: Tensor = field(init=False, repr=False, compare=False)
    #: ``[total]`` int64 (CPU): the CP-order position of every original token (inverse of ``sources``).
    placement: Tensor = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # everything is computed here, once (host arithmetic): compiled code only reads it
        _check_layout(self.layout)
        if self.ring < 1 or self.ulysses < 1:
            raise ValueError(
                f"PackedLayout: ring and ulysses sizes must be >= 1, got {self.ring}, {self.ulysses}"
            )
        object.__setattr__(self, "padded_lengths", self._padded_lengths())
        object.__setattr__(self, "_ring_segments", self._segments_per_ring_rank())
        sources = torch.cat([self._ring_local_sources(r) for r in range(self.ring)])
        object.__setattr__(self, "sources", sources)
        object.__setattr__(self, "placement", self._placement(sources))

    # ------------------------------------------------------------------ lengths
    @property
    def chunks(self) -> int:
        """Chunks each sample is cut into for the ring (1 without a ring)."""
        return num_chunks(self.ring, self.layout) if self.ring > 1 else 1

    def _padded_lengths(self) -> tuple[int, ...]:
        c = self.chunks
        padded = [-(-n // c) * c for n in self.packed.lengths]
        multiple = c * self.ulysses
        padded[-1] += -sum(padded) % multiple
        return tuple(padded)

    @property
    def padded_total(self) -> int:
        return sum(self.padded_lengths)

    @property
    def ring_local_len(self) -> int:
        """Tokens of one ring rank's share (what attention sees after the Ulysses all-to-all)."""
        return self.padded_total // self.ring

    @property
    def local_len(self) -> int:
        """Tokens one rank holds."""
        return self.ring_local_len // self.ulysses

    def ring_segments(self, ring_rank: int) -> tuple[int, ...]:
        """Ring rank ``ring_rank``'s local segment lengths ``real_0, pad_0, real_1, pad_1, ...``."""
        return self._ring_segments[ring_rank]

    def _segments_per_ring_rank(self) -> tuple[tuple[int, ...], ...]:
        per_rank: list[list[int]] = [[] for _ in range(self.ring)]
        for real, padded in zip(self.packed.lengths, self.padded_lengths, strict=True):
            share = padded // self.ring
            counts = real_token_counts(real, share, self.ring, self.layout) if self.ring > 1 else [real]
            for rank, count in enumerate(counts):
                per_rank[rank] += [count, share - count]
        return tuple(tuple(s) for s in per_rank)

    def local_segments(self, ring_rank: int, ulysses_rank: int) -> tuple[int, ...]:
        """Rank (ring, ulysses)'s own segment lengths (``real_0, pad_0, ...``, zeros where its piece of the
        ring-local sequence holds none of a segment): e.g. the query segments of a cross-attention of
        its local tokens to per-sample text (:func:`mm_parallel.packed_attention`)."""
        start, stop = ulysses_rank * self.local_len, (ulysses_rank + 1) * self.local_len
        out, begin = [], 0
        for n in self.ring_segments(ring_rank):
            out.append(max(0, min(begin + n, stop) - max(begin, start)))
            begin += n
        return tuple(out)

    # ------------------------------------------------------------------ token positions
    def _ring_local_sources(self, ring_rank: int) -> Tensor:
        pieces = []
        pad = self.packed.total
        for start, real, padded in zip(
            self.packed.offsets, self.packed.lengths, self.padded_lengths, strict=True
        ):
            positions = torch.arange(padded)
            source = torch.where(positions < real, positions + start, pad)
            if self.ring > 1:
                parts = source.chunk(self.chunks)
                source = torch.cat([parts[c] for c in rank_chunk_ids(ring_rank, self.ring, self.layout)])
            pieces.append(source)
        return torch.cat(pieces)

    def local_sources(self, ring_rank: int, ulysses_rank: int) -> Tensor:
        """``[local_len]``: the original token at each local position of rank (ring, ulysses)."""
        start = (ring_rank * self.ulysses + ulysses_rank) * self.local_len
        return self.sources.narrow(0, start, self.local_len)

    def local_valid(self, ring_rank: int, ulysses_rank: int) -> Tensor:
        """``[local_len]`` bool: which local positions of rank (ring, ulysses) hold real tokens."""
        return self.local_sources(ring_rank, ulysses_rank) < self.packed.total

    def _placement(self, sources: Tensor) -> Tensor:
        # every pad position lands in one extra slot, dropped: no data-dependent shapes
        where = torch.zeros(self.packed.total + 1, dtype=torch.int64)
        where.scatter_(0, sources, torch.arange(sources.numel()))
        return where[: self.packed.total]


Packing = PackedSequence | PackedLayout
"""What the packed attention functions take: the samples (the layout is built for the call's groups, or
found in a cache) or a layout built before (what a compiled block should be handed: nothing is built
inside the compiled code)."""


@functools.lru_cache(maxsize=64)
def _cached_layout(packed: PackedSequence, ring: int, ulysses: int, layout: Layout) -> PackedLayout:
    return PackedLayout(packed, ring, ulysses, layout)


def packed_layout(packing: Packing, ring: int, ulysses: int, layout: Layout) -> PackedLayout:
    """The :class:`PackedLayout` of ``packing`` over ``ring`` x ``ulysses`` ranks (cached: every attention
    call of a forward shares one); a given layout is checked against the sizes. Without a ring the
    layout does not matter (each sample is one chunk)."""
    layout = layout if ring > 1 else "contiguous"
    if isinstance(packing, PackedLayout):
        mine = (packing.ring, packing.ulysses, packing.layout if packing.ring > 1 else "contiguous")
        if mine != (ring, ulysses, layout):
            raise ValueError(
                f"packed attention: the PackedLayout is for ring {packing.ring} x ulysses {packing.ulysses} "
                f"({packing.layout}), the call runs on ring {ring} x ulysses {ulysses} ({layout})"
            )
        return packing
    return _cached_layout(packing, ring, ulysses, layout)
