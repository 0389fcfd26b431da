"""`GlobalOrderSampler`: a sample order that depends on (seed, epoch, dataset, global batch) only.

How the order is built (per epoch):

1. permute all indices with ``numpy.random.default_rng([seed, epoch])`` (identity if not shuffling);
2. walk the permutation and append each index to its bucket's open batch; a batch that reaches
   ``global_batch_size`` is emitted. So every global batch holds one bucket only, and the list of
   global batches is the same on every rank and for every layout. Leftovers are dropped
   (``drop_last=True``) or padded by cycling through the bucket's samples.

How a rank consumes it: dp rank ``r`` takes the contiguous slice
``[r * G/dp, (r + 1) * G/dp)`` of each global batch and yields it as ``G / (dp * micro)``
micro-batches of ``micro_batch_size`` indices, in order (these are the gradient-accumulation
micro-steps of one optimizer step). Context-parallel ranks pass their dp rank, so all ranks of
a CP group get the same micro-batches. Optimizer step ``s`` therefore always sees global batch
``s``, whatever dp, cp or accumulation split the run uses.

State is counted in global samples: ``consumed_samples`` (whole global batches) plus the
``micro_offset`` into the current one; a resume at another dp size continues at the next unseen
global batch (a mid-step offset can resume only with the same dp size and micro batch size).
"""

from __future__ import annotations

import functools
import itertools
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from torch.utils.data import Sampler

__all__ = ["GlobalOrderSampler"]


class GlobalOrderSampler(Sampler[list[int]]):
    """Yields this dp rank's micro-batches (lists of dataset indices) in the global order.

    Args:
        dataset: A dataset (its ``len`` and, when present, ``bucket_ids`` are used) or a length.
        global_batch_size: Samples per optimizer step over all dp ranks (micro x accum x dp).
        dp_rank: This rank's data-parallel rank (CP ranks of one group share it).
        dp_size: Data-parallel world size.
        seed: Seed of the permutation (combined with the epoch).
        micro_batch_size: Indices per yielded batch; default ``global_batch_size // dp_size``
            (no accumulation).
        shuffle: Permute each epoch (else dataset order).
        drop_last: Drop each bucket's incomplete last global batch (else pad it by cycling).
        buckets: Bucket id per sample; default ``dataset.bucket_ids`` or one bucket.
    """

    def __init__(
        self,
        dataset: Any,
        *,
        global_batch_size: int,
        dp_rank: int,
        dp_size: int,
        seed: int = 0,
        micro_batch_size: int | None = None,
        shuffle: bool = True,
        drop_last: bool = True,
        buckets: Sequence[int] | None = None,
    ) -> None:
        self.num_samples = dataset if isinstance(dataset, int) else len(dataset)
        if buckets is None and not isinstance(dataset, int):
            buckets = getattr(dataset, "bucket_ids", None)
        self.bucket_ids = list(buckets) if buckets is not None else [0] * self.num_samples
        if len(self.bucket_ids) != self.num_samples:
            raise ValueError(f"buckets has {len(self.bucket_ids)} entries for {self.num_samples} samples")
        if dp_size < 1 or not 0 <= dp_rank < dp_size:
            raise ValueError(f"need 0 <= dp_rank < dp_size, got dp_rank={dp_rank}, dp_size={dp_size}")
        if global_batch_size < 1 or global_batch_size % dp_size:
            raise ValueError(
                f"global_batch_size={global_batch_size} must be a positive multiple of dp_size={dp_size}"
            )
        per_rank = global_batch_size // dp_size
        micro_batch_size = micro_batch_size or per_rank
        if per_rank % micro_batch_size:
            raise ValueError(
                f"global_batch_size / dp_size = {per_rank} is not a multiple of micro_batch_size={micro_batch_size}"
            )
        self.global_batch_size, self.micro_batch_size = global_batch_size, micro_batch_size
        self.dp_rank, self.dp_size, self.seed = dp_rank, dp_size, seed
        self.shuffle, self.drop_last = shuffle, drop_last
        self.epoch, self.consumed_samples, self.micro_offset = 0, 0, 0
        self._cache: tuple[int, list[list[int]]] | None = None

    @functools.cached_property
    def batches_per_epoch(self) -> int:
        """Global batches in every epoch (the order changes per epoch, each bucket's count does not)."""
        counts = Counter(self.bucket_ids).values()
        g = self.global_batch_size
        return sum(n // g if self.drop_last else -(-n // g) for n in counts)

    @property
    def accumulation_steps(self) -> int:
        """Micro-batches per optimizer step on each rank."""
        return self.global_batch_size // (self.dp_size * self.micro_batch_size)

    def global_batches(self, epoch: int) -> list[list[int]]:
        """All global batches of ``epoch`` (the same on every rank and layout)."""
        if self._cache is None or self._cache[0] != epoch:
            self._cache = (epoch, self._build(epoch))
        return self._cache[1]

    def _build(self, epoch: int) -> list[list[int]]:
        if self.shuffle:
            order = np.random.default_rng([self.seed, epoch]).permutation(self.num_samples).tolist()
        else:
            order = list(range(self.num_samples))
        open_batches: dict[int, list[int]] = {}
        batches: list[list[int]] = []
        for index in order:
            batch = open_batches.setdefault(self.bucket_ids[index], [])
            batch.append(index)
            if len(batch) == self.global_batch_size:
                batches.append(open_batches.pop(self.bucket_ids[index]))
        if not self.drop_last:
            for bucket, batch in sorted(open_batches.items()):
                members = itertools.cycle([i for i in order if self.bucket_ids[i] == bucket])
                batches.append(batch + [next(members) for _ in range(self.global_batch_size - len(batch))])
        return batches

    def __len__(self) -> int:
        """Micro-batches this rank yields in a full epoch."""
        return len(self.global_batches(self.epoch)) * self.accumulation_steps

    def rank_micro_batches(self, global_batch: list[int]) -> list[list[int]]:
        """This rank's micro-batches of one global batch."""
        per_rank = self.global_batch_size // self.dp_size
        mine = global_batch[self.dp_rank * per_rank : (self.dp_rank + 1) * per_rank]
        return [mine[k : k + self.micro_batch_size] for k in range(0, per_rank, self.micro_batch_size)]

    def __iter__(self) -> Iterator[list[int]]:
        batches = self.global_batches(self.epoch)
        step = self.consumed_samples // self.global_batch_size
        while step < len(batches):
            micro = self.rank_micro_batches(batches[step])
            while True:
                batch = micro[self.micro_offset]
                self._advance()  # state counts the batch as consumed once it is handed out
                yield batch
                if self.micro_offset == 0:  # the step's last micro-batch: on to the next global batch
                    break
            step = self.consumed_samples // self.global_batch_size
        self.set_epoch(self.epoch + 1)

    def _advance(self) -> None:
        self.micro_offset += 1
        if self.micro_offset == self.accumulation_steps:
            self.consumed_samples += self.global_batch_size
            self.micro_offset = 0

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning; a no-op when it is already the current epoch."""
        if epoch != self.epoch:
            self.epoch, self.consumed_samples, self.micro_offset = int(epoch), 0, 0

    def position(self) -> int:
        """Micro-batches of the current epoch this rank has handed out."""
        return self.consumed_samples // self.global_batch_size * self.accumulation_steps + self.micro_offset

    def sample_ids_at(self, epoch: int, position: int) -> list[int]:
        """Global sample indices of this rank's micro-batch number ``position`` (0-based) of ``epoch``.

        A sample's global index is its place in the run's global order: ``epoch x samples per epoch``
        plus its place in the epoch's concatenated global batches. It is the same whatever the dp
        size, micro batch size or accumulation, so it keys per-sample randomness
        (``mm_pipelines.SampleRNG``) and identifies what a step trained.
        """
        step, offset = divmod(position, self.accumulation_steps)
        per_rank = self.global_batch_size // self.dp_size
        first = step * self.global_batch_size + self.dp_rank * per_rank + offset * self.micro_batch_size
        base = epoch * self.batches_per_epoch * self.global_batch_size
        return list(range(base + first, base + first + self.micro_batch_size))

    def dataset_index(self, sample_id: int) -> int:
        """The dataset index (row of the data) of global sample ``sample_id`` (:meth:`sample_ids_at`)."""
        per_epoch = self.batches_per_epoch * self.global_batch_size
        epoch, place = divmod(sample_id, per_epoch)
        step, slot = divmod(place, self.global_batch_size)
        return self.global_batches(epoch)[step][slot]

    def state_at(self, epoch: int, position: int) -> dict[str, Any]:
        """The state after handing out ``position`` micro-batches of ``epoch``."""
        steps, offset = divmod(position, self.accumulation_steps)
        return {
            "epoch": epoch,
            "consumed_samples": steps * self.global_batch_size,
            "micro_offset": offset,
            "global_batch_size": self.global_batch_size,
            "micro_batch_size": self.micro_batch_size,
            "dp_size": self.dp_size,
            "seed": self.seed,
            "num_samples": self.num_samples,
        }

    def state_dict(self) -> dict[str, Any]:
        """Epoch and consumed global samples (plus what makes a resume checkable)."""
        return self.state_at(self.epoch, self.position())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at the next unseen global sample; dp size may differ at a step boundary.

        Raises:
            ValueError: the state belongs to another seed, dataset or global batch size, it stops
                mid-step and the dp size or micro batch size changed, or its position is no position
                of this sampler (negative, past the epoch's end, not an integer).
        """
        self._check_position(state)
        for key in ("seed", "num_samples", "global_batch_size"):
            if key in state and state[key] != getattr(self, key):
                raise ValueError(
                    f"sampler state has {key}={state[key]} but this sampler has {getattr(self, key)}; "
                    "the global order would differ"
                )
        offset = state.get("micro_offset", 0)
        if offset and (state.get("dp_size"), state.get("micro_batch_size")) != (
            self.dp_size,
            self.micro_batch_size,
        ):
            raise ValueError(
                f"sampler state stops {offset} micro-batches into a step (dp_size={state.get('dp_size')}, "
                f"micro_batch_size={state.get('micro_batch_size')}); resume at a step boundary to change layout"
            )
        if offset >= self.accumulation_steps:
            raise ValueError(
                f"sampler state has micro_offset={offset}; a step of this sampler has {self.accumulation_steps} "
                "micro-batches"
            )
        if state["consumed_samples"] % self.global_batch_size:
            raise ValueError(
                f"consumed_samples={state['consumed_samples']} is not a multiple of the global batch"
            )
        self.epoch, self.consumed_samples, self.micro_offset = (
            state["epoch"],
            state["consumed_samples"],
            offset,
        )

    def _check_position(self, state: dict[str, Any]) -> None:
        """Refuse a position this sampler cannot be at: a negative or fractional count would resume on
        other samples than the run's next ones (a file edited or corrupted on disk)."""
        limits = {
            "epoch": (0, None),
            "consumed_samples": (0, self.batches_per_epoch * self.global_batch_size),
            "micro_offset": (0, None),
        }
        for key, (low, high) in limits.items():
            value = state.get(key, 0) if key == "micro_offset" else state.get(key)
            if (
                not isinstance(value, int)
                or isinstance(value, bool)
                or value < low
                or (high is not None and value > high)
            ):
                bound = f"an integer in [{low}, {high}]" if high is not None else f"an integer >= {low}"
                raise ValueError(f"sampler state has {key}={value!r}; expected {bound}")
