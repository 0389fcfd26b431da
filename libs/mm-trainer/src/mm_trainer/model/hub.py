"""ModelHub: build one sub-model from its config section, on meta or with real weights."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from mm_config import GENERIC_TRANSFORMERS_ID
from mm_parallel import parse_dtype
from torch import nn

from mm_trainer.registry.registries import MODEL_REGISTRY, RegistryError


class ModelHub:
    """Builds sub-models by ``model_id``.

    Only a class registered with ``@model_register(model_id)`` builds. An unregistered id is an error,
    also over a transformers directory: transformers' generic class is asked for by name
    (``model_id: hf_causal_lm``, :mod:`mm_trainer.model.hf_model`), so a misspelt app id never trains
    silently through it, without the app's model-specific parts.
    """

    @staticmethod
    def build(args: Any, *, meta_init: bool | None = None) -> nn.Module:
        """Build the module for ``args`` (a ``model.models.<name>`` section).

        With ``meta_init`` the structure is created under ``torch.device("meta")``
        and weights are loaded later (after FSDP sharding) by ``setup_weights``.
        Without it, ``from_pretrained`` loads real weights now when a source is
        given, else ``build_from_config`` builds a randomly initialized module.
        """
        meta = bool(args.meta_init if meta_init is None else meta_init)
        model_id = args.model_id
        model = _build_registered(_registered_class(args), args, meta)
        dtype = parse_dtype(getattr(args, "dtype", None), key=f"model {model_id!r} dtype")
        if dtype is not None:
            model.to(dtype)
        return model


def _build_registered(cls: Any, args: Any, meta: bool) -> nn.Module:
    if meta:
        with torch.device("meta"):
            return cls.build_from_config(args)
    if args.from_pretrained or getattr(args, "checkpoint_path", None):
        model = cls.from_pretrained(args)
        model.weights_loaded = True
        return model
    return cls.build_from_config(args)


def _is_transformers_dir(path: str) -> bool:
    config = Path(path) / "config.json"
    if not config.is_file():
        return False
    try:
        return "model_type" in json.loads(config.read_text())
    except (OSError, json.JSONDecodeError):
        return False


def _registered_class(args: Any) -> Any:
    """The class registered as ``args.model_id``; for an unknown id over a transformers directory the
    registry's error also names the generic id."""
    try:
        return MODEL_REGISTRY.get(args.model_id)
    except RegistryError as err:
        if args.from_pretrained and _is_transformers_dir(args.from_pretrained):
            raise RegistryError(
                f"{err} {args.from_pretrained} is a transformers directory: for transformers' generic class "
                f"(its config.json's `architectures`) set model_id: {GENERIC_TRANSFORMERS_ID}"
            ) from None
        raise
