"""ModelHub: build one sub-model from its config section, on meta or with real weights."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from mm_parallel import parse_dtype
from torch import nn

from mm_trainer.model.hf_model import import_transformers
from mm_trainer.registry.registries import MODEL_REGISTRY


class ModelHub:
    """Builds sub-models by ``model_id``.

    Resolution order: a class registered with ``@model_register(model_id)``;
    otherwise, when ``from_pretrained`` is a transformers directory (its
    ``config.json`` has a ``model_type``), the generic ``hf_causal_lm`` path
    (:mod:`mm_trainer.model.hf_model`: the ``architectures[0]`` class, with a loss).
    Registered ids win so that a plugin's bridge (e.g. a UMT5 wrapper with its
    own ``post_load``) is never bypassed by the generic path.
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
        if model_id in MODEL_REGISTRY:
            model = _build_registered(MODEL_REGISTRY.get(model_id), args, meta)
        elif args.from_pretrained and _is_transformers_dir(args.from_pretrained):
            model = _build_transformers(args, meta)
        else:
            MODEL_REGISTRY.get(model_id)  # raises listing the known ids
            raise AssertionError("unreachable")
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


def _build_transformers(args: Any, meta: bool) -> nn.Module:
    import_transformers(f"model {args.model_id!r} ({args.from_pretrained} is a transformers directory)")
    return _build_registered(MODEL_REGISTRY.get("hf_causal_lm"), args, meta)
