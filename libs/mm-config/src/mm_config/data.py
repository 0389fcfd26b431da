"""``data``: which registered dataset to build, where its files are, and DataLoader options."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, ValidationInfo, field_validator, model_validator

from .base import ConfigModel, InputPath
from .errors import Problem, RuleViolations
from .known_ids import registered_name
from .registry import dataset_schema, validate_plugin_dict


class PackingConfig(ConfigModel):
    """``data.packing``: several samples of different shapes in one token sequence per micro-batch
    (attention restricted to each sample), assigned to data-parallel ranks and micro-steps by tokens
    (``mm_data.TokenBalancedSampler``). The global step's samples are ``training.global_batch_size``
    consecutive samples of the epoch's permutation, whatever their shapes; ``training.micro_batch_size``
    then only sets the micro-steps per step (global batch / (dp x micro batch size)), and the samples of
    a step are spread over them by tokens."""

    token_budget: int = Field(ge=1)
    """Most tokens (the predictor's, after patchify) in one micro-batch's packed sequence. A sample above
    it, or a global step of the first epoch that cannot fit its micro-steps, is refused before training."""


class DataConfig(ConfigModel):
    """The ``data`` section."""

    dataset_id: Annotated[str | None, registered_name("dataset")] = None
    """Registered dataset id; selects the dataset builder and the schema of ``dataset``."""
    data_path: InputPath | None = None
    """Annotation / index file listing the samples, or a directory: a caption folder (``video_text``: clips
    with a same-named ``.txt`` caption each) or a cache folder (the cached datasets)."""
    data_root: InputPath | None = None
    """Directory that relative media paths in ``data_path`` are resolved against (refused by datasets
    that read no media paths, such as precomputed latents)."""
    dataset: dict[str, Any] = {}
    """Dataset-specific keyword arguments, validated by the schema registered for ``dataset_id`` (if any)."""
    num_workers: int = Field(default=0, ge=0)
    """DataLoader worker processes; 0 loads in the training process."""
    pin_memory: bool = False
    """Pin host memory of batches for faster device copies."""
    prefetch_factor: int | None = Field(default=None, ge=1)
    """Batches each worker loads ahead; only with num_workers > 0 (None = torch default)."""
    persistent_workers: bool = False
    """Keep the worker processes (and what they opened) alive from one epoch to the next instead of
    starting new ones; only with num_workers > 0."""
    drop_last: bool = True
    """Drop the last incomplete global batch of an epoch."""
    shuffle: bool = True
    """Shuffle sample order each epoch (seeded by training.seed)."""
    packing: PackingConfig | None = None
    """Packed micro-batches (``PackingConfig``); None = each micro-batch stacks samples of one bucket."""

    @field_validator("dataset")
    @classmethod
    def _validate_plugin_dataset(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        return validate_plugin_dict(dataset_schema(info.data.get("dataset_id")), value, info.context)

    @model_validator(mode="after")
    def _workers_needed(self) -> DataConfig:
        problems = []
        if self.num_workers == 0 and self.prefetch_factor is not None:
            problems.append(
                Problem(
                    ("prefetch_factor",),
                    "needs data.num_workers > 0 (it is 0)",
                    self.prefetch_factor,
                    deps=(("num_workers",),),
                )
            )
        if self.num_workers == 0 and self.persistent_workers:
            problems.append(
                Problem(
                    ("persistent_workers",),
                    "needs data.num_workers > 0 (it is 0)",
                    True,
                    deps=(("num_workers",),),
                )
            )
        if problems:
            raise RuleViolations(problems)
        return self

    @field_validator("data_path")
    @classmethod
    def _path_if_needed(cls, value: str | None, info: ValidationInfo) -> str | None:
        schema = dataset_schema(info.data.get("dataset_id"))
        if value is None and getattr(schema, "needs_data_path", False):
            raise ValueError(f"dataset `{info.data['dataset_id']}` needs data.data_path")
        return value

    @field_validator("data_root")
    @classmethod
    def _root_if_read(cls, value: str | None, info: ValidationInfo) -> str | None:
        schema = dataset_schema(info.data.get("dataset_id"))
        if value is not None and not getattr(schema, "reads_data_root", True):
            raise ValueError(
                f"dataset `{info.data['dataset_id']}` reads no relative media paths, so data_root would "
                "be ignored; remove it (data.data_path names the folder)"
            )
        return value


__all__ = ["DataConfig"]
