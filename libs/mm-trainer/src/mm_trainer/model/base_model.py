"""BaseModel: the two-phase life cycle of a trainable or frozen sub-model.

Phase 1 builds the structure (``from_pretrained`` with real weights, or
``build_from_config`` on the meta device). Phase 2, ``setup_weights``, loads weight
*content* after FSDP has laid out the shards, so that no rank ever holds the
whole model. A model only supplies the hooks that are specific to it:
``post_load`` and ``weight_transform_model_type`` (the key map registered in
mm-checkpoint).
"""

from __future__ import annotations

from typing import Any

import torch
from mm_checkpoint import LoadReport, load_checkpoint_with_conversion, resolve_checkpoint_source
from torch import nn


class BaseModel:
    """Mixin for ``nn.Module`` sub-models built by :class:`~mm_trainer.ModelHub`.

    ``args`` everywhere is the sub-model's own config section
    (``model.models.<name>`` of the YAML), never the whole config tree.
    """

    #: Name of a key map registered in ``mm_checkpoint.KEY_MAP_REGISTRY``.
    weight_transform_model_type: str | None = None
    #: Public contract: True once real weights are in the module. ``ModelHub.build`` sets it after
    #: ``from_pretrained``, ``setup_weights`` after a load, the trainer after loading a module of
    #: another class; a model that loads weights some other way sets it itself. The trainer never
    #: loads or randomly initializes a module that has it set.
    weights_loaded: bool = False

    @classmethod
    def from_pretrained(cls, args: Any) -> nn.Module:
        """Build the module with real weights from ``args.from_pretrained``."""
        raise NotImplementedError(f"{cls.__name__} does not implement from_pretrained(args)")

    @classmethod
    def build_from_config(cls, args: Any) -> nn.Module:
        """Build the module structure from ``args`` without loading weights (may run on meta).

        Public hook: ``ModelHub.build`` calls it under ``torch.device("meta")`` for ``meta_init`` and
        when the section names no weights; a model's own ``from_pretrained`` usually calls it too.
        """
        raise NotImplementedError(f"{cls.__name__} does not implement build_from_config(args)")

    def setup_weights(self, args: Any) -> LoadReport | None:
        """Load weights named by ``args`` (checkpoint_path > from_pretrained); None when no source.

        A source that fails to load raises: a model never trains from random
        weights because a load went wrong.
        """
        report = load_module_weights(self, args, model_type=self.weight_transform_model_type)  # type: ignore[arg-type]
        if report is not None:
            self.weights_loaded = True
            self.post_load()
        return report

    def post_load(self) -> None:
        """Hook after weights are loaded (re-tie shared embeddings, re-cast dtypes...)."""

    def random_init(self) -> None:
        """Random initialization for a sub-model that loaded nothing: ``reset_parameters`` of each module.

        (Not named ``init_weights``: transformers' ``post_init`` calls that name at construction.)
        """
        init_module_weights(self)  # type: ignore[arg-type]


def init_module_weights(module: nn.Module) -> None:
    """Call ``reset_parameters`` on every submodule that defines it (the torch default init)."""
    with torch.no_grad():
        for sub in module.modules():
            reset = getattr(sub, "reset_parameters", None)
            if callable(reset):
                reset()


def load_module_weights(module: nn.Module, args: Any, *, model_type: str | None = None) -> LoadReport | None:
    """Resolve the source of ``args`` and load it into ``module`` (plain, materialized or FSDP-sharded).

    ``args.weight_transform`` overrides ``model_type``. Returns None when ``args``
    names no source.
    """
    source = resolve_checkpoint_source(args)
    if source.path is None:
        return None
    return load_checkpoint_with_conversion(
        module,
        source.path,
        fmt=source.declared_format,
        model_type=getattr(args, "weight_transform", None) or model_type,
        strict=True,
        conversion_dir=source.conversion_dir,
    )
