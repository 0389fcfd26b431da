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


class SourceConfig(ConfigModel):
    """One entry of ``data.sources``: a data set read by ``data.dataset_id`` with the ``data.dataset`` options,
    its samples held ``repeats`` times an epoch."""

    data_path: InputPath
    """What ``data.data_path`` would be for this source alone (a metadata file, caption folder or cache)."""
    data_root: InputPath | None = None
    """What ``data.data_root`` would be for this source (refused where the dataset reads no media paths)."""
    repeats: int = Field(default=1, ge=1)
    """Times each of this source's samples is trained per epoch (each time with its own noise, timestep and
    random draws); the weight of a source in the run is its samples x repeats."""


class DataConfig(ConfigModel):
    """The ``data`` section."""

    dataset_id: Annotated[str | None, registered_name("dataset")] = None
    """Registered dataset id; selects the dataset builder and the schema of ``dataset``."""
    sources: list[SourceConfig] | None = Field(default=None, min_length=1)
    """Several data sets of ``dataset_id`` in one run (``mm_data.ConcatSources``), each with its own
    ``data_path`` / ``data_root`` and ``repeats``, instead of ``data_path`` / ``data_root``; None = the one
    data set of ``data_path``."""
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

    @model_validator(mode="after")
    def _sources_fit_the_dataset(self) -> DataConfig:
        if self.sources is None:
            return self
        problems = source_problems(self.dataset_id, self.sources, self.dataset)
        problems += [
            Problem(
                (key,),
                "give it in each entry of data.sources instead",
                getattr(self, key),
                deps=(("sources",),),
            )
            for key in ("data_path", "data_root")
            if getattr(self, key) is not None
        ]
        if problems:
            raise RuleViolations(problems)
        return self

    @field_validator("data_path")
    @classmethod
    def _path_if_needed(cls, value: str | None, info: ValidationInfo) -> str | None:
        schema = dataset_schema(info.data.get("dataset_id"))
        if value is None and info.data.get("sources") is None and getattr(schema, "needs_data_path", False):
            raise ValueError(f"dataset `{info.data['dataset_id']}` needs data.data_path (or data.sources)")
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


def source_problems(
    dataset_id: str | None, sources: list[SourceConfig], dataset: dict[str, Any]
) -> list[Problem]:
    """What ``data.sources`` asks that ``dataset_id`` cannot do: sources at all (its schema's ``takes_sources``
    is False), a source's ``data_root`` where it reads no media paths (``reads_data_root``), or a
    ``data.dataset`` key that describes one data path (its ``one_source_keys``, e.g. the ``preprocess`` of
    one cache)."""
    schema = dataset_schema(dataset_id)
    if not getattr(schema, "takes_sources", True):
        why = f"dataset `{dataset_id}` reads one data set; give data.data_path instead"
        return [Problem(("sources",), why, deps=(("dataset_id",),))]
    problems = [
        Problem(
            ("sources", i, "data_root"),
            f"dataset `{dataset_id}` reads no relative media paths, so data_root would be ignored; remove it",
            source.data_root,
            deps=(("dataset_id",),),
        )
        for i, source in enumerate(sources)
        if source.data_root is not None and not getattr(schema, "reads_data_root", True)
    ]
    for key, why in getattr(schema, "one_source_keys", {}).items():
        if dataset.get(key) is not None:
            problems.append(
                Problem(("dataset", key), f"{why}; data.sources lists several", deps=(("sources",),))
            )
    return problems


__all__ = ["DataConfig", "SourceConfig"]
