"""The config a training run saved beside its checkpoints, for tools that work on its results."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mm_checkpoint import checkpoint_info
from mm_checkpoint.errors import CheckpointNotFoundError
from mm_config import DataConfig, TrainConfig, load_config

RUN_CONFIG_NAME = "config.yaml"

OFFLINE_LAYOUT = (
    "parallel.ulysses_parallel_size=1",
    "parallel.ring_attention_size=1",
    "parallel.replicate_parallel_size=1",
    "parallel.fully_shard_parallel_size=auto",
)
"""Overrides that make a training config valid as one process: the layout is no concern of offline tools."""


def weight_sources(model: Any) -> dict[str, str]:
    """Sub-model name -> the resolved folder (or file) its weights come from (``checkpoint_path`` over
    ``from_pretrained``), for every sub-model of a ``model`` section that names one. A checkpoint records
    it (``mm_checkpoint.json``: ``sources``), so an export of a run root finds each sub-model's
    ``config.json`` there."""
    sources = {}
    for name, sub in model.sub_models().items():
        path = sub.checkpoint_path or sub.from_pretrained
        if path:
            sources[name] = str(Path(path).resolve())
    return sources


def load_offline_config(path: str | os.PathLike, overrides: Sequence[str] = ()) -> TrainConfig:
    """A user's training config for a tool that runs outside training (e.g. an encoder cache's
    preprocess, sharded by ``RANK`` alone): validated as one process, whatever its parallel layout.
    A missing file is a :class:`~mm_config.ConfigError`, as every other config problem."""
    return load_config(path, [*overrides, *OFFLINE_LAYOUT], world_size=1)


def load_run_config(checkpoint_root: str | os.PathLike, overrides: Sequence[str] = ()) -> TrainConfig:
    """``<checkpoint_root>/config.yaml`` validated at the world size of its latest checkpoint.

    The saved config is resolved (``fully_shard_parallel_size``, the global batch...) for the world
    size the run had, so tools such as export or sampling, which run as one process, must read it
    with that world size rather than their own.
    """
    root = Path(checkpoint_root)
    path = root / RUN_CONFIG_NAME
    if not path.is_file():
        raise CheckpointNotFoundError(
            f"{path} not found: a training run writes its resolved config next to its checkpoints"
        )
    return load_config(path, list(overrides), world_size=int(checkpoint_info(root)["world_size"]))


def preprocess_section(config: TrainConfig | DataConfig, *, dataset_id: str, schema: Any, tool: str) -> Any:
    """``data.dataset.preprocess`` of a config (or of its ``data`` section) that trains from the encoder
    cache ``dataset_id`` (in ``data.data_path``), validated by ``schema`` (a pydantic model); what ``tool``
    needs, or a clear error."""
    data = config.data if isinstance(config, TrainConfig) else config
    raw = (data.dataset or {}).get("preprocess")
    if data.dataset_id != dataset_id or not raw or not data.data_path:
        keys = ", ".join(getattr(schema, "model_fields", {}))
        raise ValueError(
            f"{tool} needs data.dataset_id: {dataset_id}, data.data_path (the cache folder) and "
            f"data.dataset.preprocess {{{keys}}}"
        )
    return schema.model_validate(raw)
