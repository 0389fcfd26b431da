"""The trainer's batch stream: a dataset from the registry behind mm-data's resumable loader.

Built-in dataset ids: ``video_text`` (``mm_data.VideoTextDataset``, ``data.data_path`` is
its metadata file or caption folder), ``video_pairs`` (``mm_data.PreferencePairs``, a pairs file) and ``precomputed_latents`` (``mm_data.PrecomputedLatentDataset``,
``data.data_path`` is the cache directory); mm-config holds their ``data.dataset`` schemas
(``mm_config.VideoTextDatasetConfig``, ``PrecomputedLatentsConfig``). Plugins register more with ``@data_register``;
a registered callable is called with ``data.dataset`` as keyword arguments plus
``data_path`` / ``data_root`` when set, and may expose ``collate_fn``. With ``data.sources`` the id is built
once per source and the datasets joined with their repeats (``mm_data.ConcatSources``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from mm_data import (
    ConcatSources,
    PrecomputedLatentDataset,
    PreferencePairs,
    VideoTextDataset,
    build_dataloader,
    build_packed_dataloader,
    collate_video_text,
)

from mm_trainer.data import conversation as _conversation  # noqa: F401 - registers the "conversation" dataset
from mm_trainer.registry.registries import DATA_REGISTRY, data_register


@data_register("video_text")
def video_text_dataset(*, data_path: str, data_root: str | None = None, **kwargs: Any) -> VideoTextDataset:
    """``VideoTextDataset`` over the metadata file or caption folder ``data.data_path``."""
    return VideoTextDataset(data_path, data_root=data_root, **kwargs)


@data_register("video_pairs")
def video_pairs_dataset(*, data_path: str, data_root: str | None = None, **kwargs: Any) -> PreferencePairs:
    """``PreferencePairs`` over the pairs file ``data.data_path`` (Diffusion-DPO's offline pairs)."""
    return PreferencePairs(data_path, data_root=data_root, **kwargs)


@data_register("precomputed_latents")
def precomputed_latents_dataset(*, data_path: str, data_root: str | None = None, **kwargs: Any) -> Any:
    """``PrecomputedLatentDataset`` over the cache directory ``data.data_path`` (``data_root`` is
    refused: the cache holds no relative media paths)."""
    if data_root is not None:
        raise ValueError(f"data.data_root={data_root!r}: precomputed_latents reads no media paths; remove it")
    return PrecomputedLatentDataset(data_path, **kwargs)


class BatchStream:
    """Endless micro-batches across epochs, with the loader's resumable position.

    Each batch gets ``sample_ids``: the global sample index of each of its samples (the loader's
    ``last_sample_ids``; the same numbers at any layout), which key the pipeline's random draws
    (``mm_pipelines.SampleRNG``).

    Bad samples that the dataset passed over (items' ``skipped``, from any DataLoader worker) are
    taken out of the batch and counted per epoch: :attr:`bad_this_epoch`. Every sample is read by
    exactly one data-parallel rank per epoch, so the sum over ranks is the epoch's count, which the
    engine checks against :attr:`bad_limit`.
    """

    def __init__(self, loader: Any, *, packed_micro_batch: float | None = None) -> None:
        self.loader = loader
        #: packed micro-batches (``data.packing``): the mean samples per micro-batch (the micro batch
        #: size), by which the engine weighs a micro-batch's loss (its sample count / this); else None
        self.packed_micro_batch = packed_micro_batch
        self._it: Iterator[Any] | None = None
        self._bad: set[int] = set()
        self._resumed = False  # the next iter() continues a saved epoch: keep its bad samples
        #: the most bad samples an epoch may hold (``max_bad_fraction`` x dataset length), None = no limit
        self.bad_limit = _bad_limit(getattr(loader, "dataset", None))

    @property
    def bad_this_epoch(self) -> int:
        """Distinct bad samples this rank's batches passed over in the current epoch."""
        return len(self._bad)

    def next_batch(self) -> Any:
        """The next micro-batch of this data-parallel rank; a new epoch starts when one ends."""
        for _ in range(2):
            if self._it is None:
                self._it = iter(self.loader)
                if not self._resumed:
                    self._bad.clear()
                self._resumed = False
            try:
                return self._with_sample_ids(self._take_skipped(next(self._it)))
            except StopIteration:
                self._it = None
        raise RuntimeError("the dataset yields no batch: fewer samples than one global batch?")

    def _take_skipped(self, batch: Any) -> Any:
        if isinstance(batch, dict) and "skipped" in batch:
            self._bad.update(int(i) for items in batch.pop("skipped") for i in items)
        return batch

    def _with_sample_ids(self, batch: Any) -> Any:
        ids = getattr(self.loader, "last_sample_ids", None)
        if ids is None:
            return batch
        if not isinstance(batch, dict):
            raise TypeError(
                f"the collate function returned a {type(batch).__name__}; the trainer needs a dict batch"
            )
        if "sample_ids" in batch:
            raise ValueError(
                "the batch already has a 'sample_ids' key; the trainer adds the global sample indices "
                "under that name: rename the dataset's key"
            )
        return {**batch, "sample_ids": torch.tensor(ids, dtype=torch.long)}

    def describe_samples(self, sample_ids: Sequence[int]) -> str:
        """Global samples in words, with the data rows they are (``data.data_path``'s entries)."""
        sampler = getattr(self.loader, "sampler", None)
        if not callable(getattr(sampler, "dataset_index", None)):
            return f"global sample ids {list(sample_ids)}"
        rows = [sampler.dataset_index(i) for i in sample_ids]
        source = getattr(getattr(self.loader, "dataset", None), "metadata_path", None)
        return f"global sample ids {list(sample_ids)} = data rows {rows}" + (
            f" of {source}" if source else ""
        )

    def state_dict(self) -> dict[str, Any]:
        """The loader's position and the epoch's bad samples so far (a resume keeps counting them)."""
        return {"loader": self.loader.state_dict(), "bad_samples": sorted(self._bad)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict` (or a bare loader state, saved before bad samples were kept)."""
        loader, bad = _split_state(state)
        self.loader.load_state_dict(loader)
        self._bad = set(bad)
        self._it, self._resumed = None, True

    def load_rank_states(self, states: Sequence[dict[str, Any]], *, dp_rank: int, dp_size: int) -> None:
        """Continue from the states every data-parallel rank of a run at another layout saved.

        The position is layout-free (epoch and global samples consumed): all ranks saved the same
        one, and any rank, old or new, continues from it. The epoch's bad samples (the union of the
        saved ranks') go to dp rank 0 only, so their sum over ranks still counts each once.

        Raises:
            ValueError: the saved ranks disagree on the position (the message shows both).
        """
        positions = [_split_state(state)[0] for state in states]
        for rank, position in enumerate(positions[1:], start=1):
            if position != positions[0]:
                raise ValueError(
                    f"inconsistent data state: dp rank 0 saved position {positions[0]} but dp rank {rank} "
                    f"saved {position}"
                )
        self.loader.load_state_dict(positions[0])
        self._bad = set().union(*(_split_state(s)[1] for s in states)) if dp_rank == 0 else set()
        self._it, self._resumed = None, True


def _bad_limit(dataset: Any) -> float | None:
    """``max_bad_fraction`` x rows of ``dataset`` (its ``tracker``), or what it states (``bad_sample_limit``:
    ``mm_data.ConcatSources`` sums its sources'); None = no limit."""
    if hasattr(dataset, "bad_sample_limit"):
        return dataset.bad_sample_limit
    tracker = getattr(dataset, "tracker", None)
    return tracker.max_bad_fraction * tracker.total if tracker is not None else None


def _split_state(state: dict[str, Any]) -> tuple[dict[str, Any], list[int]]:
    """(loader state, bad samples) of a :meth:`BatchStream.state_dict` or of a bare loader state."""
    if set(state) == {"loader", "bad_samples"}:
        bad = state["bad_samples"]
        if not isinstance(bad, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in bad
        ):
            raise ValueError(f"bad_samples={bad!r}; expected a list of sample indices (integers >= 0)")
        return state["loader"], list(bad)
    return state, []


def build_dataset(data: Any, *, data_path: str | None = None) -> Any:
    """The dataset ``data.dataset_id`` with the ``data.dataset`` options, over ``data.data_path``
    (or ``data_path``: e.g. the held-out file of ``training.validation``); with ``data.sources`` (and no
    ``data_path``), one such dataset per source joined with its repeats (``mm_data.ConcatSources``)."""
    sources = getattr(data, "sources", None)
    if sources and data_path is None:
        datasets = [_registered_dataset(data, s.data_path, s.data_root) for s in sources]
        return ConcatSources(
            datasets, [s.repeats for s in sources], names=[str(s.data_path) for s in sources]
        )
    if data_path is not None:
        return _registered_dataset(data, data_path, data.data_root)
    return _registered_dataset(data, data.data_path, data.data_root)


def _registered_dataset(data: Any, data_path: str | None, data_root: str | None) -> Any:
    kwargs = dict(data.dataset or {})
    if data_path is not None:
        kwargs["data_path"] = data_path
    if data_root is not None:
        kwargs["data_root"] = data_root
    return DATA_REGISTRY.get(data.dataset_id)(**kwargs)


def build_batch_stream(
    data: Any,
    *,
    global_batch_size: int,
    micro_batch_size: int,
    dp_rank: int,
    dp_size: int,
    seed: int,
    sample_tokens: Callable[[Any], Sequence[int]] | None = None,
) -> BatchStream:
    """Build the dataset named by ``data.dataset_id`` and its loader for this dp rank.

    With ``data.packing``: packed micro-batches (``mm_data.build_packed_dataloader``) over the token
    counts ``sample_tokens(dataset)`` (the model container's ``packing_tokens``), as many per step as
    unpacked (global batch / (dp x micro batch size)).
    """
    dataset = build_dataset(data)
    packing = getattr(data, "packing", None)
    if packing is not None:
        return _packed_batch_stream(
            data, dataset, packing.token_budget, sample_tokens, global_batch_size, micro_batch_size, dp_rank,
            dp_size, seed,
        )  # fmt: skip
    loader = build_dataloader(
        dataset,
        global_batch_size=global_batch_size,
        micro_batch_size=micro_batch_size,
        dp_rank=dp_rank,
        dp_size=dp_size,
        seed=seed,
        num_workers=data.num_workers,
        collate_fn=getattr(dataset, "collate_fn", None) or collate_video_text,
        shuffle=data.shuffle,
        drop_last=data.drop_last,
        pin_memory=bool(data.pin_memory),
        prefetch_factor=data.prefetch_factor,
        persistent_workers=data.persistent_workers,
    )
    return BatchStream(loader)


def _packed_batch_stream(
    data: Any,
    dataset: Any,
    token_budget: int,
    sample_tokens: Callable[[Any], Sequence[int]] | None,
    global_batch_size: int,
    micro_batch_size: int,
    dp_rank: int,
    dp_size: int,
    seed: int,
) -> BatchStream:
    if sample_tokens is None:
        raise ValueError(
            "data.packing: the model container does not count its samples' tokens (a `packing_tokens(dataset)` "
            "method); this model cannot train packed micro-batches"
        )
    loader = build_packed_dataloader(
        dataset,
        list(sample_tokens(dataset)),
        global_batch_size=global_batch_size,
        dp_rank=dp_rank,
        dp_size=dp_size,
        token_budget=token_budget,
        seed=seed,
        micro_steps=global_batch_size // (dp_size * micro_batch_size),
        num_workers=data.num_workers,
        shuffle=data.shuffle,
        drop_last=data.drop_last,
        pin_memory=bool(data.pin_memory),
        prefetch_factor=data.prefetch_factor,
        persistent_workers=data.persistent_workers,
    )
    return BatchStream(loader, packed_micro_batch=float(micro_batch_size))


def to_device(batch: Any, device: torch.device) -> Any:
    """Move every tensor in a (nested) batch to ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch
