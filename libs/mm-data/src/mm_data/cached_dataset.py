"""`CachedVideoTextDataset`: the samples of a :class:`~mm_data.VideoTextDataset`, read from their cached
encodings, with the caption still drawn at train time.

What is fixed at encode time and what is drawn at train time (so that training from the cache is the
training from the clips, sample for sample):

- the frames: one window per clip (``frame_offset: start`` or ``center``; a ``random`` offset would
  freeze the first epoch's draw, so a cache of it is refused by the writers), in the clip's bucket size;
- the latents: deterministic encodings (e.g. the VAE posterior's mode, never a sample of it);
- the caption: every distinct caption of the row and the empty prompt are encoded
  (:func:`caption_candidates`), stored as ``prompt_embeds.<j>`` (``[tokens_j, D]``, the real tokens
  only) with metadata ``captions`` (the texts, in order of ``j``) and ``text_len`` (the padded
  length); each epoch draws the prompt with :func:`~mm_data.captions.draw_caption` from
  ``(seed, epoch, index)``, exactly as the clip dataset does, and zero-pads its embeddings to
  ``text_len`` (the padding positions an online text encoder zeroes);
- the sample order: the cache keeps the source's length and bucket ids, and a sample the source
  could not read is replaced by the next one of its bucket, as the source did.

The folder is a sharded cache (``index.json``) or a per-file one of earlier versions (``cache.json``):
:func:`mm_data.open_cache` reads either.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from .bad_samples import BadSample, BadSampleTracker
from .buckets import same_bucket_order
from .cache_store import open_cache
from .captions import caption_candidates, draw_caption, sample_rng

__all__ = ["CAPTION_KEY", "CachedVideoTextDataset", "caption_entries"]

CAPTION_KEY = "prompt_embeds"
"""Tensor name of the drawn caption's embeddings in an item (``<name>.<j>`` per caption in a file)."""


class _BadCacheEntry(Exception):
    """The source could not read this sample: it has a bad marker instead of a file."""


def caption_entries(
    caption: str | Sequence[str], embeddings: Sequence[torch.Tensor], text_len: int
) -> dict[str, Any]:
    """The tensors + metadata of a cache file's captions.

    Args:
        caption: The row's caption(s), as the source dataset's metadata holds them.
        embeddings: One ``[tokens, D]`` tensor per text of ``caption_candidates(caption)``, in that order
            (the real tokens only: the padding the text encoder's output zeroes is left out).
        text_len: Length the embeddings are zero-padded to at train time.
    """
    texts = caption_candidates(caption)
    if len(embeddings) != len(texts):
        raise ValueError(f"{len(embeddings)} caption embeddings for the {len(texts)} prompts {texts}")
    out: dict[str, Any] = {f"{CAPTION_KEY}.{j}": e for j, e in enumerate(embeddings)}
    original = caption if isinstance(caption, str) else list(caption)
    out["metadata"] = {"caption": original, "captions": texts, "text_len": int(text_len)}
    return out


class CachedVideoTextDataset(Dataset):
    """A cache folder of :func:`~mm_data.cache_dataset` with :func:`caption_entries` in each sample.

    Items: the file's tensors but the per-caption ones, ``prompt_embeds [text_len, D]`` (the drawn
    caption's), ``prompt``, ``index`` (the sample actually read), ``bucket`` and ``skipped`` (the bad
    samples passed over), as :class:`~mm_data.VideoTextDataset` gives them.

    Args:
        root: The cache folder (sharded, or per-file of earlier versions).
        seed: Seed of the caption draw (the source dataset's ``seed``).
        caption_dropout: Probability of the empty prompt.
        max_bad_fraction: Stop when more than this fraction of the samples is bad (as the source).

    Raises:
        FileNotFoundError: the folder has no manifest, or a sample is neither encoded nor marked bad
            (an unfinished preprocess: the message names the first missing ones).
    """

    def __init__(
        self, root: str | Path, *, seed: int = 0, caption_dropout: float = 0.0, max_bad_fraction: float = 0.05
    ) -> None:
        if not 0.0 <= caption_dropout <= 1.0:
            raise ValueError(f"caption_dropout must be in [0, 1], got {caption_dropout}")
        self.root = Path(root)
        self.store = open_cache(self.root)
        self.bucket_ids: list[int] = list(self.store.bucket_ids)
        self.seed, self.caption_dropout, self.epoch = seed, caption_dropout, 0
        self.tracker = BadSampleTracker(len(self.bucket_ids), max_bad_fraction)
        self._check_complete()

    def _check_complete(self) -> None:
        missing = self.store.incomplete()
        if missing:
            raise FileNotFoundError(
                f"{self.root}: {len(missing)} of {len(self)} samples are not cached (first: {missing[:5]}); "
                "the preprocess did not finish: run it again (it continues where it stopped)"
            )

    def __len__(self) -> int:
        return len(self.bucket_ids)

    @functools.cached_property
    def latent_shapes(self) -> list[tuple[int, ...] | None]:
        """Each sample's ``latents`` shape (``[C, T, h, w]``), from the cache's headers (no tensor read): what
        a packed run counts its tokens by. A row the source could not read has the shape of the row that
        replaces it (the next good one of its bucket); None where its bucket has no good row."""
        return [self._shape_read_for(i) for i in range(len(self))]

    def _shape_read_for(self, index: int) -> tuple[int, ...] | None:
        for row in same_bucket_order(self.bucket_ids, index):
            if self.store.bad(row) is None:
                return self.store.shape_of(row, "latents")
        return None

    def set_epoch(self, epoch: int) -> None:
        """Vary the caption draw per epoch (called by :func:`mm_data.build_dataloader`)."""
        self.epoch = int(epoch)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.tracker.first_good(
            same_bucket_order(self.bucket_ids, int(index)), self._item, self._bad, (_BadCacheEntry,)
        )

    def _bad(self, index: int, error: Exception) -> BadSample:
        return BadSample(index, *error.args)

    def _item(self, index: int) -> dict[str, Any]:
        bad = self.store.bad(index)
        if bad is not None:
            raise _BadCacheEntry(*bad)
        tensors, metadata = self.store.read(index)
        prompt = draw_caption(metadata.get("caption", ""), sample_rng(self.seed, self.epoch, index),
                              self.caption_dropout)  # fmt: skip
        item: dict[str, Any] = {k: v for k, v in tensors.items() if not k.startswith(f"{CAPTION_KEY}.")}
        item[CAPTION_KEY] = _padded(tensors, metadata, prompt, f"{self.root} sample {index}")
        item.update(prompt=prompt, index=index, bucket=self.bucket_ids[index])
        return item


def _padded(
    tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, Any], prompt: str, where: str
) -> torch.Tensor:
    """The embeddings of ``prompt``, zero-padded to the file's ``text_len`` tokens."""
    texts = list(metadata.get("captions", []))
    if prompt not in texts:
        raise KeyError(f"{where}: no embeddings of the prompt {prompt!r}; it has {texts}")
    embeds = tensors[f"{CAPTION_KEY}.{texts.index(prompt)}"]
    text_len = int(metadata["text_len"])
    return torch.nn.functional.pad(embeds, (0, 0, 0, text_len - embeds.shape[0]))
