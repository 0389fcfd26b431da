"""The ``wan22_cached`` dataset id: the encoder cache written by ``wan22-train preprocess``, read at train time.

One YAML drives both steps: ``data.data_path`` is the cache folder, ``data.dataset.preprocess`` says
where the clips and the frozen encoders are (``wan22-train preprocess`` reads it; a training run checks
that the cache records the same section and an unchanged source metadata file, before any model loads:
``mm_trainer.check_cache_made_as_configured``); ``model.models`` holds the predictor(s) alone, so a run
from the cache loads neither the VAE nor UMT5.
"""

from __future__ import annotations

from typing import Any

from mm_data import CachedVideoTextDataset
from mm_trainer import data_register, register_preprocess_section

from wan22_train.config_schema import WanPreprocessOptions

register_preprocess_section("wan22_cached", WanPreprocessOptions)


@data_register("wan22_cached")
def wan22_cached_dataset(
    *,
    data_path: str,
    data_root: str | None = None,
    seed: int = 0,
    caption_dropout: float = 0.0,
    max_bad_fraction: float = 0.05,
    preprocess: dict[str, Any] | None = None,
) -> CachedVideoTextDataset:
    """``CachedVideoTextDataset`` over the cache folder ``data.data_path`` (``data_root`` is refused: the
    cache holds no relative media paths; ``preprocess`` is the preprocess command's, which the trainer
    checks the cache against)."""
    if data_root is not None:
        raise ValueError(f"data.data_root={data_root!r}: wan22_cached reads no media paths; remove it")
    return CachedVideoTextDataset(
        data_path, seed=seed, caption_dropout=caption_dropout, max_bad_fraction=max_bad_fraction
    )
