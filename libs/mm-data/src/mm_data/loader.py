"""`build_dataloader` / `build_packed_dataloader`: a DataLoader over a `GlobalOrderSampler` (or a
`TokenBalancedSampler`) whose state matches what was consumed."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from .collate import collate_packed, collate_video_text
from .sampler import GlobalOrderSampler
from .token_balance import TokenBalancedSampler

__all__ = ["ResumableDataLoader", "build_dataloader", "build_packed_dataloader"]

OrderSampler = GlobalOrderSampler | TokenBalancedSampler


def _worker_init(_: int) -> None:
    torch.set_num_threads(1)


class _EpochBatches:
    """The sampler's micro-batches with the epoch attached to each index: ``[(epoch, i), ...]``."""

    def __init__(self, sampler: OrderSampler) -> None:
        self.sampler = sampler

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        epoch = self.sampler.epoch
        for batch in self.sampler:
            yield [(epoch, index) for index in batch]


class _EpochIndexed(Dataset):
    """Reads ``(epoch, index)`` keys: calls the dataset's ``set_epoch`` when the epoch changes, in
    whichever process reads, so a worker kept alive across epochs (``persistent_workers``) draws
    the new epoch's random choices instead of keeping the epoch it started with."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset
        self._epoch: int | None = None

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, key: tuple[int, int]) -> Any:
        epoch, index = key
        if epoch != self._epoch and hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)
        self._epoch = epoch
        return self.dataset[index]


class ResumableDataLoader:
    """Iterates micro-batches of a :class:`GlobalOrderSampler`; ``state_dict`` counts consumed batches.

    Workers prefetch indices ahead of the training loop, so the sampler's own counters run ahead;
    this wrapper records the sampler state after each batch it hands to the caller, and rewinds the
    sampler to that state when a new iteration starts. The state is the sampler's (epoch, consumed
    global samples), so it can be saved per rank and loaded at another dp size. Every index travels
    with its epoch, so the dataset's ``set_epoch`` happens where the item is read (in the worker).
    """

    def __init__(self, dataset: Dataset, sampler: OrderSampler, **loader_kwargs: Any) -> None:
        self.dataset, self.sampler = dataset, sampler
        self.loader = DataLoader(
            _EpochIndexed(dataset), batch_sampler=_EpochBatches(sampler), **loader_kwargs
        )
        self._state = sampler.state_dict()
        #: global sample indices of the last batch handed out (``GlobalOrderSampler.sample_ids_at``)
        self.last_sample_ids: list[int] = []

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[Any]:
        self.sampler.load_state_dict(self._state)  # drop any read-ahead of an earlier iteration
        epoch, position = self.sampler.epoch, self.sampler.position()
        for batch in self.loader:
            self.last_sample_ids = self.sampler.sample_ids_at(epoch, position)
            position += 1
            self._state = self.sampler.state_at(epoch, position)
            yield batch
        self._state = self.sampler.state_at(epoch + 1, 0)

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` at its beginning (no-op for the current epoch)."""
        if epoch != self._state["epoch"]:
            self._state = self.sampler.state_at(epoch, 0)

    def state_dict(self) -> dict[str, Any]:
        """The sampler state after the last batch handed out."""
        return dict(self._state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from a state saved by any rank of a run with the same seed and global batch."""
        self.sampler.load_state_dict(state)
        self._state = self.sampler.state_dict()


def _loader_kwargs(
    seed: int,
    num_workers: int,
    collate_fn: Callable[[list[Any]], Any],
    pin_memory: bool,
    prefetch_factor: int | None,
    persistent_workers: bool,
    multiprocessing_context: Any,
) -> dict[str, Any]:
    if persistent_workers and num_workers == 0:
        raise ValueError("persistent_workers needs num_workers > 0 (there are no workers to keep)")
    # A private generator: creating a DataLoader iterator draws a base seed from it, and drawing from
    # the global torch RNG instead would make a resumed run's noise differ from an uninterrupted one.
    generator = torch.Generator().manual_seed(seed)
    kwargs: dict[str, Any] = {
        "collate_fn": collate_fn,
        "num_workers": num_workers,
        "pin_memory": pin_memory,
        "generator": generator,
    }
    if num_workers > 0:
        kwargs.update(
            worker_init_fn=_worker_init,
            multiprocessing_context=multiprocessing_context,
            persistent_workers=persistent_workers,
        )
        if prefetch_factor is not None:
            kwargs["prefetch_factor"] = prefetch_factor
    return kwargs


def build_packed_dataloader(
    dataset: Dataset,
    tokens: Sequence[int],
    *,
    global_batch_size: int,
    dp_rank: int,
    dp_size: int,
    token_budget: int,
    seed: int = 0,
    micro_steps: int | None = None,
    num_workers: int = 0,
    collate_fn: Callable[[list[Any]], Any] = collate_packed,
    shuffle: bool = True,
    drop_last: bool = True,
    pin_memory: bool = False,
    prefetch_factor: int | None = None,
    persistent_workers: bool = False,
    multiprocessing_context: Any = None,
) -> ResumableDataLoader:
    """A resumable loader of this dp rank's packed micro-batches (:class:`TokenBalancedSampler` over
    ``tokens``, one count per dataset sample), collated per sample (:func:`collate_packed`).

    ``micro_steps`` fixes the micro-batches per global step (a trainer's gradient accumulation);
    ``last_sample_ids`` and ``state_dict`` / ``load_state_dict`` work as for :func:`build_dataloader`.

    Raises:
        TokenBudgetError: a sample above ``token_budget`` (named with its tokens), or a global step of
            the first epoch that does not fit (:meth:`TokenBalancedSampler.check_epoch`), before any read.
    """
    if len(tokens) != len(dataset):  # type: ignore[arg-type]
        raise ValueError(f"tokens has {len(tokens)} entries for {len(dataset)} samples")  # type: ignore[arg-type]
    kwargs = _loader_kwargs(
        seed,
        num_workers,
        collate_fn,
        pin_memory,
        prefetch_factor,
        persistent_workers,
        multiprocessing_context,
    )
    sampler = TokenBalancedSampler(
        tokens,
        global_batch_size=global_batch_size,
        dp_rank=dp_rank,
        dp_size=dp_size,
        token_budget=token_budget,
        seed=seed,
        micro_steps=micro_steps,
        shuffle=shuffle,
        drop_last=drop_last,
    )
    sampler.check_epoch(sampler.epoch)
    return ResumableDataLoader(dataset, sampler, **kwargs)


def build_dataloader(
    dataset: Dataset,
    *,
    global_batch_size: int,
    dp_rank: int,
    dp_size: int,
    seed: int = 0,
    micro_batch_size: int | None = None,
    num_workers: int = 0,
    collate_fn: Callable[[list[Any]], Any] = collate_video_text,
    shuffle: bool = True,
    drop_last: bool = True,
    buckets: Sequence[int] | None = None,
    pin_memory: bool = False,
    prefetch_factor: int | None = None,
    persistent_workers: bool = False,
    multiprocessing_context: Any = None,
) -> ResumableDataLoader:
    """A resumable loader yielding this dp rank's micro-batches in the global order.

    Each optimizer step consumes ``global_batch_size // (dp_size * micro_batch_size)`` batches.
    Save ``loader.state_dict()`` in the checkpoint; ``loader.load_state_dict(state)`` continues at
    the next unseen global sample, also at another dp size. ``persistent_workers`` (with
    ``num_workers > 0``) keeps the worker processes from one epoch to the next; they still see
    each epoch's ``set_epoch``.
    """
    kwargs = _loader_kwargs(
        seed,
        num_workers,
        collate_fn,
        pin_memory,
        prefetch_factor,
        persistent_workers,
        multiprocessing_context,
    )
    sampler = GlobalOrderSampler(
        dataset,
        global_batch_size=global_batch_size,
        dp_rank=dp_rank,
        dp_size=dp_size,
        seed=seed,
        micro_batch_size=micro_batch_size,
        shuffle=shuffle,
        drop_last=drop_last,
        buckets=buckets,
    )
    return ResumableDataLoader(dataset, sampler, **kwargs)
