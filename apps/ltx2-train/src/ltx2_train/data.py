"""The ``ltx2_precomputed`` dataset id: the cache written by ``ltx2-train preprocess``, read at train time.

One YAML drives both steps: ``data.data_path`` is the cache folder, ``data.dataset.preprocess``
says where the clips and the frozen encoders are (``ltx2-train preprocess`` reads it; a training run
checks that the cache records the same section and an unchanged source metadata file, before any model
loads: ``mm_trainer.check_cache_made_as_configured``).
"""

from __future__ import annotations

from typing import Any

from mm_data import PrecomputedLatentDataset
from mm_trainer import data_register, register_preprocess_section

from ltx2_train.config_schema import LTX2PrecomputedSchema, PreprocessOptions

register_preprocess_section("ltx2_precomputed", PreprocessOptions)


@data_register("ltx2_precomputed")
def ltx2_precomputed_dataset(
    *, data_path: str, data_root: str | None = None, preprocess: dict[str, Any] | None = None
) -> PrecomputedLatentDataset:
    """``PrecomputedLatentDataset`` over the cache folder ``data.data_path`` (``data_root`` is refused:
    the cache holds no relative media paths). Samples of one ``latents`` shape share a bucket (its
    ``bucket_ids``), so a micro-batch holds clips of one size, or images (one latent frame) of one size."""
    if data_root is not None:
        raise ValueError(f"data.data_root={data_root!r}: ltx2_precomputed reads no media paths; remove it")
    return PrecomputedLatentDataset(data_path)


__all__ = ["LTX2PrecomputedSchema", "PreprocessOptions", "ltx2_precomputed_dataset"]
