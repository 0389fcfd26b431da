"""``model``: one model (``model_id`` + its keys) or several named sub-models (``models``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import ValidationInfo, field_validator, model_validator

from .base import ConfigModel, DType, InputPath
from .errors import Problem, RuleViolations
from .hf_model import GENERIC_TRANSFORMERS_ID
from .known_ids import registered_name, unknown_name
from .lora import LoraConfig
from .registry import model_schema, pipeline_schema, validate_plugin_dict

LoadFormat = Literal["auto", "dcp", "diffusers", "hf", "safetensors", "pth"]
"""Canonical weight formats of mm-checkpoint (``mm_checkpoint.normalize_format`` values)."""


class SubModelConfig(ConfigModel):
    """How to build, load and treat one (sub-)model."""

    model_id: str | None = None
    """Registered model id (``@model_register("wan2_2_predictor")``); selects the builder and plugin schema."""
    from_pretrained: InputPath | None = None
    """Local pretrained weights, never a hub id: a diffusers / HF / DCP folder, a ``.pth`` file or a
    ComfyUI single file, or (where the app resolves components, e.g. wan22-train) a release folder as
    downloaded; None builds from ``config`` only."""
    load_format: LoadFormat = "auto"
    """Declared weight format: ``auto`` sniffs DCP, then diffusers, then HF, then a ``.pth`` file
    (``pth``: a ``torch.save`` state dict, read with ``weights_only``); ``safetensors`` sniffs diffusers
    or HF; ``dcp`` with a safetensors or ``.pth`` source converts it once into the conversion dir."""
    checkpoint_path: InputPath | None = None
    """Weights to load instead of ``from_pretrained`` (wins over it)."""
    checkpoint_conversion_dir: str | None = None
    """Cache directory of the online conversion to DCP (``load_format: dcp`` with a safetensors source);
    the only key that names it."""
    meta_init: bool = False
    """Build on the meta device; parameters are materialized only after FSDP sharding."""
    dtype: DType = None
    """Cast the built model to this dtype; None keeps the model's own dtype (fp32)."""
    freeze: bool = False
    """eval() and requires_grad=False on every parameter; a frozen sub-model is never trained or saved."""
    weight_transform: str | None = None
    """Registered key-map name used to convert foreign checkpoints; None = the model class default."""
    config: dict[str, Any] = {}
    """Model-specific keys, validated by the schema registered for ``model_id`` (if any)."""
    lora: LoraConfig | None = None
    """Train low-rank adapters on this sub-model instead of all its weights (None: full fine-tuning)."""

    @field_validator("config")
    @classmethod
    def _validate_plugin_config(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        return validate_plugin_dict(model_schema(info.data.get("model_id")), value, info.context)

    @model_validator(mode="after")
    def _model_id_is_registered(self, info: ValidationInfo) -> SubModelConfig:
        """With ``check_ids`` (``mm-config check``, the trainer's preflight): a registered model id. An
        unregistered id is an error even over a transformers folder (a misspelt app id would otherwise
        train through the generic class, without the app's model-specific parts); transformers' generic
        class is asked for by name, ``model_id: hf_causal_lm`` (:data:`GENERIC_TRANSFORMERS_ID`)."""
        why = unknown_name("model", self.model_id, info.context)
        if why:
            if _is_transformers_dir(self.from_pretrained):
                why += (
                    f"; {self.from_pretrained} is a transformers folder: for transformers' generic class "
                    f"(its config.json's `architectures`) set model_id: {GENERIC_TRANSFORMERS_ID}"
                )
            raise RuleViolations([Problem(("model_id",), why, self.model_id)])
        return self


def _is_transformers_dir(path: str | None) -> bool:
    """Whether ``path`` holds a transformers ``config.json`` (one with a ``model_type``)."""
    config = Path(path) / "config.json" if path else None
    try:
        return config is not None and "model_type" in json.loads(config.read_text())
    except (OSError, ValueError):
        return False


_SINGLE_KEYS = tuple(SubModelConfig.model_fields)
"""Keys of the single-model form (set at ``model`` level); in the ``models`` form they stay default."""


class ModelConfig(SubModelConfig):
    """The ``model`` section: single form (``model_id`` and the keys above) or ``models: {name: ...}``."""

    models: dict[str, SubModelConfig] = {}
    """Named sub-models of a container (``ae``, ``text_encoder``, ``predictor``); their names are
    the first segment of module paths in plans."""
    container_id: Annotated[str | None, registered_name("container")] = None
    """Registered container id holding ``models`` (e.g. ``wan2_2_container``)."""
    pipeline: dict[str, Any] = {}
    """Options of the training pipeline, validated by the schema its owner registered: the container
    (``container_id``), or in the single form the model (``model_id``)."""

    @field_validator("pipeline")
    @classmethod
    def _validate_pipeline(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        # the container's id, or in the single form (no container_id) the model's
        owner = info.data.get("container_id") or info.data.get("model_id")
        return validate_plugin_dict(pipeline_schema(owner), value, info.context)

    @model_validator(mode="after")
    def _check_form(self) -> ModelConfig:
        problems: list[Problem] = []
        if self.models:
            if self.container_id is None and self.pipeline:
                problems.append(
                    Problem(
                        ("pipeline",),
                        "the plain container (no container_id) runs no pipeline; set "
                        "model.container_id to a container that builds one",
                        deps=(("container_id",),),
                    )
                )
            for key in [
                k for k in _SINGLE_KEYS if getattr(self, k) != SubModelConfig.model_fields[k].default
            ]:
                problems.append(
                    Problem(
                        (key,),
                        "single-model key not allowed together with `models`; "
                        "move it under model.models.<name>",
                        getattr(self, key),
                        deps=(("models",),),
                    )
                )
            for name, sub in self.models.items():
                if not name.isidentifier():
                    problems.append(
                        Problem(
                            ("models", name),
                            "sub-model name must be a Python identifier "
                            "(it is the first segment of module paths)",
                        )
                    )
                if not sub.model_id:
                    problems.append(Problem(("models", name, "model_id"), "expected a registered model id"))
        else:
            if self.container_id is not None:
                problems.append(
                    Problem(
                        ("container_id",), "a container needs sub-models under `models`", self.container_id
                    )
                )
            if not self.model_id and (self.model_fields_set - {"model_id", "pipeline"}):
                problems.append(
                    Problem(("model_id",), "expected a registered model id (other model keys are set)")
                )
        if problems:
            raise RuleViolations(problems)
        return self

    @property
    def is_container(self) -> bool:
        """True for the ``models`` form."""
        return bool(self.models)

    def sub_models(self) -> dict[str, SubModelConfig]:
        """Sub-models by name; the single form is ``{"model": ...}``, an empty section ``{}``."""
        if self.models:
            return dict(self.models)
        if not self.model_id:
            return {}
        values = {k: getattr(self, k) for k in _SINGLE_KEYS}
        return {"model": SubModelConfig.model_construct(set(_SINGLE_KEYS) & self.model_fields_set, **values)}

    def trainable_submodels(self) -> list[str]:
        """Names of sub-models that are not frozen, in declaration order."""
        return [name for name, sub in self.sub_models().items() if not sub.freeze]


__all__ = ["ModelConfig", "SubModelConfig"]
