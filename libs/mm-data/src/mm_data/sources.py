"""`ConcatSources`: several datasets of one kind as one, each sample of source ``s`` held ``repeats[s]``
times an epoch (a folder of images and a folder of clips; a small set seen more often than a large one).

The index space is the sources one after another, each repeated in place: source 0's rows ``repeats[0]``
times, then source 1's, and so on. A sampler (``GlobalOrderSampler``, ``TokenBalancedSampler``) permutes
these indices like any dataset's, so the order stays a function of (seed, epoch, data) and the resume
position counts them; every index has its own place in the global order, so a repeated row gets its own
``sample_ids`` (its own noise and timestep, ``mm_pipelines.SampleRNG``). A source's own random draws (frame
window, caption, dropout: keyed by ``(seed, epoch, row)``) are made at the source epoch
``epoch x repeats + k`` for repeat ``k``, so each repeat draws its own, and a source of ``repeats: 1`` draws
exactly what the dataset alone draws.

Buckets are joined by shape where the sources state it (``buckets``: samples of one size and frame count
from two folders share a bucket), else kept apart per source. Items keep the source's keys; ``bucket`` is the
joined bucket, ``index`` and ``skipped`` count rows over the sources without repeats (a bad row counts once
an epoch however often it is repeated).
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Sequence
from typing import Any

from torch.utils.data import Dataset

__all__ = ["ConcatSources"]


class ConcatSources(Dataset):
    """The datasets ``sources`` as one, source ``s``'s samples ``repeats[s]`` times (see the module docstring).

    Args:
        sources: Datasets of one kind (one registered dataset id over several paths).
        repeats: Times each source's samples are held per epoch (integers >= 1).
        names: What each source is called in messages (its path); default ``source <s>``.

    Raises:
        ValueError: no source, a repeat count below 1 or one count per source missing, or an empty source.
    """

    def __init__(
        self, sources: Sequence[Any], repeats: Sequence[int], *, names: Sequence[str] | None = None
    ) -> None:
        if not sources or len(repeats) != len(sources):
            raise ValueError(f"{len(sources)} sources with {len(repeats)} repeat counts; expected one each")
        self.names = list(names) if names is not None else [f"source {s}" for s in range(len(sources))]
        for name, source, r in zip(self.names, sources, repeats, strict=True):
            if isinstance(r, bool) or not isinstance(r, int) or r < 1:
                raise ValueError(f"{name}: repeats={r!r}; expected an integer >= 1")
            if len(source) == 0:
                raise ValueError(f"{name}: no samples")
        self.sources, self.repeats, self.epoch = list(sources), [int(r) for r in repeats], 0
        sizes = [len(s) * r for s, r in zip(self.sources, self.repeats, strict=True)]
        self._starts = [sum(sizes[:s]) for s in range(len(sizes) + 1)]
        rows = [len(s) for s in self.sources]
        self._row_offsets = [sum(rows[:s]) for s in range(len(rows))]
        self.bucket_ids, self.buckets = self._join_buckets()

    def __len__(self) -> int:
        return self._starts[-1]

    def locate(self, index: int) -> tuple[int, int, int]:
        """``(source, repeat, row)`` of ``index``: row ``row`` of source ``source``, its repeat ``repeat``."""
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} samples")
        s = bisect.bisect_right(self._starts, index) - 1
        repeat, row = divmod(index - self._starts[s], len(self.sources[s]))
        return s, repeat, row

    def set_epoch(self, epoch: int) -> None:
        """Vary the sources' random draws per epoch (and per repeat: see the module docstring)."""
        self.epoch = int(epoch)

    def __getitem__(self, index: int) -> dict[str, Any]:
        s, repeat, row = self.locate(int(index))
        source = self.sources[s]
        if hasattr(source, "set_epoch"):
            source.set_epoch(self.epoch * self.repeats[s] + repeat)
        item = dict(source[row])
        offset = self._row_offsets[s]
        if "index" in item:
            item["index"] = offset + int(item["index"])
        if "skipped" in item:
            item["skipped"] = [offset + int(i) for i in item["skipped"]]
        if "bucket" in item:
            item["bucket"] = self.bucket_ids[int(index)]
        return item

    # -- what the trainer and the samplers read ------------------------------------------------

    def _join_buckets(self) -> tuple[list[int], list[Any] | None]:
        """One bucket id per index; the joined ``buckets`` (shapes) when every source states its own."""
        shaped = all(getattr(s, "buckets", None) is not None for s in self.sources)
        keys: dict[Any, int] = {}
        ids: list[int] = []
        for s, source in enumerate(self.sources):
            own = list(getattr(source, "bucket_ids", None) or [0] * len(source))
            keyed = [source.buckets[b] if shaped else (s, b) for b in own]
            ids += [keys.setdefault(k, len(keys)) for k in keyed] * self.repeats[s]
        return ids, (list(keys) if shaped else None)

    def _per_index(self, name: str) -> list[Any] | None:
        """A per-row attribute of every source, laid out per index; None unless every source has it."""
        values = [getattr(s, name, None) for s in self.sources]
        if any(v is None for v in values):
            return None
        return [x for v, r in zip(values, self.repeats, strict=True) for _ in range(r) for x in v]

    @functools.cached_property
    def latent_shapes(self) -> list[tuple[int, ...] | None] | None:
        """Each index's ``latents`` shape where every source is a latent cache stating them, else None."""
        return self._per_index("latent_shapes")

    @functools.cached_property
    def rows(self) -> list[Any] | None:
        """Each index's metadata row where every source lists rows (the trainer names samples by them; laid
        out once: the sources' rows do not change)."""
        return self._per_index("rows")

    @property
    def bad_sample_limit(self) -> float | None:
        """The most bad rows an epoch may hold: each source's ``max_bad_fraction`` of its rows, summed."""
        trackers = [getattr(s, "tracker", None) for s in self.sources]
        if any(t is None for t in trackers):
            return None
        return sum(t.max_bad_fraction * t.total for t in trackers)

    @property
    def collate_fn(self) -> Any:
        """The sources' collate function, when their dataset gives one."""
        return getattr(self.sources[0], "collate_fn", None)

    def describe(self) -> str:
        """The sources and repeats in words."""
        parts = zip(self.names, self.sources, self.repeats, strict=True)
        return ", ".join(f"{name} x{r} ({len(source)} samples)" for name, source, r in parts)
