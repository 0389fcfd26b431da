"""The single-model path for transformers causal LMs and VLMs: upstream classes, our life cycle.

:class:`HFModel` is a mixin in front of a transformers ``PreTrainedModel`` class (the upstream module
tree and state-dict keys stay as they are, so an export loads with upstream ``from_pretrained``). It adds

- building from a config section: ``config.json`` of the source merged with ``model.config.hf_config``,
  on the meta device when asked (``meta_init``), weights later through mm-checkpoint (safetensors shard
  by shard, or DCP) with transformers' own checkpoint key renamings (:class:`TransformersKeyRenaming`);
- rebuilding the rotary tables (non-persistent buffers) after meta materialization;
- freeze switches per named module group (``model.config.freeze_groups``; groups are class data);
- ``forward(**batch)`` with ``use_cache=False``: the upstream next-token loss over labels != -100
  (``.loss``) plus the metrics the engine counts (samples, tokens); the loss is the one transformers
  picks for the upstream class (:func:`_upstream_loss_type`), whatever the subclass is called;
- a clear refusal of context parallelism (see :meth:`HFModel.setup_context_parallel`).

``hf_causal_lm`` is the generic id: the class is ``model.config.architecture`` or ``architectures[0]``
of ``config.json``. Apps register their own subclasses for what is model-specific.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from mm_checkpoint import KeyMapError, KeyPlan, LoadReport, register_weight_transform
from mm_config import HFModelConfig, MissingDependencyError
from mm_parallel import pattern_matches
from torch import nn

from mm_trainer.model.base_model import BaseModel
from mm_trainer.registry.registries import model_register

__all__ = ["HFModel", "TransformersKeyRenaming", "hf_class", "hf_model_class", "load_hf_config"]


def import_transformers(needed_by: str) -> Any:
    """The ``transformers`` module, or a :class:`~mm_config.MissingDependencyError` saying what needs
    it and which extra installs it."""
    try:
        import transformers
    except ImportError as exc:  # optional for the trainer: mm-trainer[transformers]
        raise MissingDependencyError(
            f"{needed_by} needs transformers, which is not installed (pip install 'mm-trainer[transformers]')"
        ) from exc
    return transformers


def _options(args: Any) -> HFModelConfig:
    return HFModelConfig.model_validate(dict(getattr(args, "config", None) or {}))


def _source_dir(args: Any) -> Path | None:
    for key in ("checkpoint_path", "from_pretrained"):
        value = getattr(args, key, None)
        if value and (Path(value) / "config.json").is_file():
            return Path(value)
    return None


def _merge(base: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in overrides.items():
        out[key] = (
            _merge(out[key], value)
            if isinstance(value, Mapping) and isinstance(out.get(key), dict)
            else value
        )
    return out


def load_hf_config(args: Any, config_class: Any) -> Any:
    """The transformers config of ``args``: the source's ``config.json`` with ``hf_config`` merged in.

    Raises:
        ValueError: neither a source with a ``config.json`` nor ``model.config.hf_config``.
    """
    options, source = _options(args), _source_dir(args)
    if source is None and not options.hf_config:
        raise ValueError(
            f"model {getattr(args, 'model_id', '?')!r}: no config.json under from_pretrained / checkpoint_path "
            f"({getattr(args, 'from_pretrained', None)!r}) and no model.config.hf_config to build from"
        )
    body = json.loads((source / "config.json").read_text()) if source else {}
    config = config_class.from_dict(_merge(body, options.hf_config))
    config._attn_implementation = options.attn_implementation
    return config


def _upstream_loss_type(upstream: type) -> str | None:
    """The ``loss_type`` transformers gives a model of class ``upstream``: the class name when
    ``LOSS_MAPPING`` has it, else the first ``LOSS_MAPPING`` key inside the name
    (``Qwen2_5_VLForConditionalGeneration`` -> ``ForConditionalGeneration``), else None
    (``PreTrainedModel.__init__``'s rule, applied to the upstream class instead of ``type(self)``)."""
    from transformers.loss.loss_utils import LOSS_MAPPING

    name = upstream.__name__
    if name in LOSS_MAPPING:
        return name
    found = re.findall(f"({'|'.join(LOSS_MAPPING)})", name)
    return found[0] if found else None


def _without_views(output: Any) -> Any:
    """Upstream's output with no tensor that is a view, where FSDP2 looks for them.

    This module is an FSDP2 root: torch registers its pre-backward hook on every grad tensor of the
    output, nested outputs included, and an in-place op on a view would drop it (torch warns "returned a
    view tensor"). Upstream's ``lm_head`` on ``[B, L, C]`` returns a view of its 2-D matmul: logits are
    copied (one logits-sized tensor). Multimodal outputs also pass the media encoders' outputs through
    (``image_outputs``, ``video_outputs``: per-sample features split from one tensor, views); nothing
    reads them here, so they are left out rather than copied.
    """
    kept = {
        key: value.clone() if isinstance(value, torch.Tensor) and value._base is not None else value
        for key, value in output.items()
        if not dataclasses.is_dataclass(value)
    }
    return type(output)(**kept)


class HFModel(BaseModel):
    """Mixin: ``class MyVLM(HFModel, UpstreamForConditionalGeneration)``; see the module docstring."""

    #: named module groups (patterns relative to the model, ``{*}`` = an integer segment) that
    #: ``model.config.freeze_groups`` may freeze
    module_groups: dict[str, tuple[str, ...]] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # transformers picks the loss by the name of ``type(self)``: a subclass named for training
        # (``Qwen2_5_VLForTraining``) names no loss, and every forward with labels would warn
        # "`loss_type=None` was set in the config but it is unrecognized" and fall back to a default
        self.loss_type = _upstream_loss_type(self.upstream_class())

    @classmethod
    def build_from_config(cls, args: Any) -> HFModel:
        model = cls(load_hf_config(args, cls.config_class))
        model.freeze_groups(_options(args).freeze_groups)
        return model

    @classmethod
    def from_pretrained(cls, args: Any) -> HFModel:  # type: ignore[override]
        model = cls.build_from_config(args)
        model.setup_weights(args)
        return model

    def setup_weights(self, args: Any) -> LoadReport | None:
        """Load through mm-checkpoint with the upstream class's checkpoint key renamings."""
        name = f"transformers:{self.upstream_class().__name__}"
        register_weight_transform(name, TransformersKeyRenaming(self), overwrite=True)
        self.weight_transform_model_type = name
        return super().setup_weights(args)

    @classmethod
    def upstream_class(cls) -> type:
        """The transformers class this model extends."""
        return next(c for c in cls.__mro__ if c.__module__.startswith("transformers."))

    def freeze_groups(self, names: Iterable[str]) -> list[str]:
        """``requires_grad=False`` on the parameters of the named groups; returns the frozen module paths."""
        frozen: list[str] = []
        for name in names:
            if name not in self.module_groups:
                raise ValueError(
                    f"model.config.freeze_groups: {type(self).__name__} has no module group {name!r}; "
                    f"its groups: {sorted(self.module_groups) or 'none'}"
                )
            for path, module in self.named_modules():
                if any(pattern_matches(p, path) for p in self.module_groups[name]):
                    module.requires_grad_(False)
                    frozen.append(path)
        return frozen

    def init_non_persistent_buffers(self) -> None:
        """Recompute rotary tables after meta materialization (upstream ``_init_weights`` does the maths)."""
        done: set[str] = set()
        for path, module in self.named_modules():
            if "RotaryEmbedding" in type(module).__name__ and hasattr(module, "original_inv_freq"):
                self._init_weights(module)
                done.update(f"{path}.{b}" for b in module._non_persistent_buffers_set)
        left = [k for k, _ in self.named_non_persistent_buffers() if k not in done]
        if left:
            raise ValueError(
                f"{type(self).__name__}: cannot rebuild non-persistent buffers {left} after meta_init"
            )

    def forward(self, num_samples: torch.Tensor | None = None, **batch: Any) -> Any:
        """Upstream forward without a KV cache; ``.loss`` is the mean next-token loss over labels != -100.

        No output tensor is a view (see :func:`_without_views`).
        """
        if "labels" not in batch:
            raise ValueError(f"{type(self).__name__}: the batch has no labels (keys: {sorted(batch)})")
        output = _without_views(super().forward(**batch, use_cache=False))
        mask = batch.get("attention_mask")
        tokens = int(mask.sum()) if mask is not None else batch["input_ids"].numel()
        samples = int(num_samples) if num_samples is not None else int(batch["input_ids"].shape[0])
        output.metrics = {"num_samples": samples, "num_tokens": tokens}
        return output

    def setup_context_parallel(self, parallel_state: Any) -> None:
        """Refused: Ulysses / Ring need the language model's activations split along the sequence before
        its first decoder layer and its mask, positions and loss built for the shards. transformers'
        attention interface (``ALL_ATTENTION_FUNCTIONS``) only replaces the attention kernel; the
        sequence is built whole inside the upstream forward (media features scattered into it, 3-D
        rotary positions and the causal mask computed over it), so no attention function can shard it."""
        raise ValueError(
            f"parallel.ulysses_parallel_size x ring_attention_size = {parallel_state.cp_size} > 1 is not "
            f"supported for {type(self).__name__}: the transformers attention interface cannot split the "
            "sequence the upstream forward builds whole (media features, 3-D positions, causal mask). "
            "Use ulysses_parallel_size: 1 and ring_attention_size: 1 (FSDP2 data parallelism only)"
        )


class TransformersKeyRenaming:
    """An mm-checkpoint key map made of transformers' checkpoint conversion mapping for a model class
    (e.g. Qwen2-VL's ``visual.*`` -> ``model.visual.*``), renamings only.

    Loading maps checkpoint keys to model keys as ``from_pretrained`` would; exporting keeps the model
    keys, which upstream ``from_pretrained`` reads as they are (as transformers' own ``save_pretrained``
    writes them). A checkpoint key that needs a tensor conversion (fusing, splitting) is refused.
    """

    def __init__(self, model: nn.Module) -> None:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter

        upstream = model.upstream_class() if isinstance(model, HFModel) else type(model)
        with torch.device("meta"):
            reference = upstream(model.config)  # transformers looks mappings up by class name
        transforms = get_model_conversion_mapping(reference)
        self.converters = [t for t in transforms if isinstance(t, WeightConverter)]
        self.renamings = [t for t in transforms if not isinstance(t, WeightConverter)]
        self.model_keys = dict.fromkeys(reference.state_dict(), True)
        self.prefix = reference.base_model_prefix
        self.name = upstream.__name__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TransformersKeyRenaming) and other.name == self.name

    __hash__ = None  # type: ignore[assignment]

    def plan_load(self, checkpoint_keys: Iterable[str]) -> dict[str, KeyPlan]:
        from transformers.core_model_loading import rename_source_key

        plans: dict[str, KeyPlan] = {}
        for key in checkpoint_keys:
            for converter in self.converters:
                if converter.rename_source_key(key)[1] is not None:
                    raise KeyMapError(
                        f"checkpoint key {key!r} needs the tensor conversion {converter!r} of {self.name}; "
                        "convert the checkpoint with transformers (from_pretrained + save_pretrained) first"
                    )
            target, _ = rename_source_key(key, self.renamings, [], self.prefix, self.model_keys)
            plans[target] = KeyPlan(target, (key,))
        return plans

    def plan_export(self, model_keys: Iterable[str]) -> dict[str, KeyPlan]:
        return {key: KeyPlan(key, (key,)) for key in model_keys}


_CLASSES: dict[type, type] = {}


def hf_model_class(upstream: type) -> type:
    """The :class:`HFModel` subclass of ``upstream`` (one per upstream class)."""
    if upstream not in _CLASSES:
        _CLASSES[upstream] = type(f"HF{upstream.__name__}", (HFModel, upstream), {"__module__": __name__})
    return _CLASSES[upstream]


def hf_class(args: Any) -> type:
    """The transformers class of a section: ``model.config.architecture`` else ``architectures[0]`` of
    the source's ``config.json``."""
    transformers = import_transformers(f"model {getattr(args, 'model_id', '?')!r}")
    name = _options(args).architecture
    source = _source_dir(args)
    if name is None and source is not None:
        name = (json.loads((source / "config.json").read_text()).get("architectures") or [None])[0]
    if name is None or not isinstance(getattr(transformers, name, None), type):
        raise ValueError(
            f"model {getattr(args, 'model_id', '?')!r}: cannot tell the transformers class (architecture "
            f"{name!r}); set model.config.architecture to a transformers class name"
        )
    return getattr(transformers, name)


@model_register("hf_causal_lm")
class HFCausalLM:
    """Generic id: any transformers causal-LM / VLM class named by the config (no module groups)."""

    @classmethod
    def build_from_config(cls, args: Any) -> nn.Module:
        return hf_model_class(hf_class(args)).build_from_config(args)

    @classmethod
    def from_pretrained(cls, args: Any) -> nn.Module:
        return hf_model_class(hf_class(args)).from_pretrained(args)
