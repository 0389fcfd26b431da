"""The LTX-2 predictor: diffusers' ``LTX2VideoTransformer3DModel`` as a trainer model, keys unchanged.

``LTX2Predictor`` only adds the trainer life cycle (build from a config section, on meta when
asked; weights through mm-checkpoint), the training pipeline factory of the single-model form,
and Ulysses sequence parallelism (:mod:`ltx2_train.context_parallel`). Module paths and state-dict
keys are upstream's, so a diffusers ``transformer/`` folder loads unchanged and an export loads back
with ``LTX2VideoTransformer3DModel.from_pretrained``; an official single file (official names under
``model.diffusion_model.``) loads through mm-checkpoint's ``ltx2`` key map.
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from diffusers import LTX2VideoTransformer3DModel
from mm_checkpoint import register_weight_transform
from mm_parallel import ParallelState, SequenceParallelPlan
from mm_trainer import BaseModel, model_register
from mm_trainer.model.build import log_rank0
from torch import nn

from ltx2_train.context_parallel import LAYOUT, install_attention_processors, sequence_parallel_forward
from ltx2_train.official import (
    TRANSFORMER_KEY_MAP,
    TransformerWeights,
    is_single_file,
    read_single_file_config,
)
from ltx2_train.version import config_version, contradictions, folder_version, single_file_version

register_weight_transform(TRANSFORMER_KEY_MAP, TransformerWeights(), overwrite=True)
INIT_KEYS = frozenset(inspect.signature(LTX2VideoTransformer3DModel.__init__).parameters) - {"self"}
TRANSFORMER_DEFAULTS = {
    name: p.default
    for name, p in inspect.signature(LTX2VideoTransformer3DModel.__init__).parameters.items()
    if p.default is not inspect.Parameter.empty
}
"""``LTX2VideoTransformer3DModel``'s argument defaults: what a key missing from a ``config.json`` means."""
#: The attentions of one ``LTX2VideoTransformerBlock``: (query stream, key/value stream).
BLOCK_ATTENTIONS = {
    "attn1": ("video", "video"),
    "attn2": ("video", "text"),
    "audio_attn1": ("audio", "audio"),
    "audio_attn2": ("audio", "text"),
    "audio_to_video_attn": ("video", "audio"),
    "video_to_audio_attn": ("audio", "video"),
}
CROSS_MODAL_ATTENTIONS = ("audio_to_video_attn", "video_to_audio_attn")  # off with isolate_modalities
BLOCK_FEEDFORWARDS = {"ff": "video", "audio_ff": "audio"}


def transformer_config(args: Any) -> dict[str, Any]:
    """Constructor kwargs: the source's ``config.json`` (if there is one; for an official single
    ``.safetensors`` file, the transformer section of its metadata, :mod:`ltx2_train.official`) updated by
    ``args.config``.

    Without weights present (e.g. ``--dry-run`` of a real config) ``args.config`` alone gives the shape.
    """
    overrides = dict(getattr(args, "config", None) or {})
    unknown = sorted(set(overrides) - INIT_KEYS)
    if unknown:
        raise ValueError(
            f"model.config: {unknown} are not LTX2VideoTransformer3DModel arguments; expected some of "
            f"{sorted(INIT_KEYS)}"
        )
    config: dict[str, Any] = {}
    source = getattr(args, "checkpoint_path", None) or getattr(args, "from_pretrained", None)
    if source and (Path(source) / "config.json").is_file():
        config = {
            k: v for k, v in json.loads((Path(source) / "config.json").read_text()).items() if k in INIT_KEYS
        }
    elif is_single_file(source):
        config = read_single_file_config(source)
    if not config and not overrides:
        raise ValueError(
            f"model: the LTX-2 predictor needs from_pretrained/checkpoint_path with a config.json, or an official "
            f"single file with a config in its metadata (got {source!r}), or a `config` section with its shape "
            "(num_layers, num_attention_heads, ...)"
        )
    config.update(overrides)
    return config


def transformer_version(args: Any) -> tuple[str, str]:
    """``(release, where it was read)`` of the transformer a config section builds
    (:mod:`ltx2_train.version`): its source's ``config.json`` when it has one, an official single file's
    metadata (a ``model.config`` key that sets a release-deciding argument otherwise is refused), else the
    ``model.config`` shape itself."""
    overrides = dict(getattr(args, "config", None) or {})
    source = getattr(args, "checkpoint_path", None) or getattr(args, "from_pretrained", None)
    if source and (Path(source) / "config.json").is_file():
        path = Path(source) / "config.json"
        version = folder_version(source)
        _refuse_contradictions(overrides, json.loads(path.read_text()), path, version)
        return version, str(path)
    if is_single_file(source):
        version = single_file_version(source)
        _refuse_contradictions(overrides, read_single_file_config(source), source, version)
        return version, str(source)
    return config_version(transformer_config(args), "model.config"), "model.config"


def _refuse_contradictions(
    overrides: dict[str, Any], checkpoint: dict[str, Any], where: Any, version: str
) -> None:
    """A ``model.config`` key that sets a release-deciding argument otherwise than the checkpoint is refused."""
    clash = contradictions(overrides, checkpoint)
    if clash:
        said = ", ".join(
            f"{k}={str(o).lower()} (the checkpoint's: {str(c).lower()})" for k, (o, c) in clash.items()
        )
        raise ValueError(
            f"model.config: {said} contradicts {where}, an LTX-{version} transformer; the release is read "
            "from the checkpoint: remove these keys"
        )


@model_register("ltx2_predictor")
class LTX2Predictor(BaseModel, LTX2VideoTransformer3DModel):
    """``LTX2VideoTransformer3DModel`` built from a config section (upstream module tree and keys).

    Activation checkpointing comes from ``features.recompute_plan`` (applied before FSDP wraps the
    blocks), never from upstream's internal ``gradient_checkpointing`` switch, which is refused.
    """

    _supports_gradient_checkpointing = False
    _sequence_parallel: SequenceParallelPlan | None = None
    #: Weights load through mm-checkpoint's ``ltx2`` map: official names (a single file's, its
    #: ``model.diffusion_model.`` prefix dropped by the ComfyUI-file view, which also hides a release file's
    #: VAEs and vocoder) -> diffusers'; diffusers keys pass; a release file's text connectors are left out
    #: (:class:`ltx2_train.official.TransformerWeights`).
    weight_transform_model_type = TRANSFORMER_KEY_MAP
    #: The LTX-2 release of the checkpoint or shape it was built from (:mod:`ltx2_train.version`).
    ltx2_version: str | None = None
    #: The container of the single-model form (``model.model_id: ltx2_predictor``): LTX-2's, whose
    #: ``training.validation`` hooks sample clips with audio (``mm_trainer.model.container.container_class``).
    single_model_container = "ltx2_container"

    @property
    def architecture_name(self) -> str:
        """What a refused LoRA file (``model.lora.init_from``) is told the model is: its LTX-2 release."""
        return f"LTX-{self.ltx2_version or '2'} transformer"

    @classmethod
    def build_from_config(cls, args: Any) -> LTX2Predictor:
        """The transformer of the config section, its LTX-2 release recognised (and logged) first
        (:func:`transformer_version`): a contradicting or unknown one is refused before anything is built."""
        config = transformer_config(args)
        version, where = transformer_version(args)
        log_rank0(f"LTX-2 transformer: LTX-{version} (read from {where})")
        model = cls(**config)
        model.ltx2_version = version
        return model

    @classmethod
    def from_pretrained(cls, args: Any) -> LTX2Predictor:  # type: ignore[override]
        model = cls.build_from_config(args)
        model.setup_weights(args)
        return model

    @classmethod
    def build_pipeline(cls, options: Mapping[str, Any]) -> Any:
        """The LTX-2 flow-matching pipeline from ``model.pipeline`` (single-model form)."""
        from ltx2_train.pipeline import LTX2Pipeline

        return LTX2Pipeline.from_options(options)

    def random_init(self) -> None:
        """Upstream's initialization: ``reset_parameters`` of each layer, ``randn / sqrt(dim)`` tables."""
        with torch.no_grad():
            for module in self.modules():
                if hasattr(module, "reset_parameters") and module is not self:
                    module.reset_parameters()
            for name, param in self.named_parameters():
                if "scale_shift_table" in name:
                    param.normal_(0.0, 1.0 / math.sqrt(param.shape[-1]))

    def training_flops(
        self, video_tokens: int, audio_tokens: int, text_tokens: int, *, cross_modal: bool = True
    ) -> float:
        """Matmul FLOPs of one sample's forward + backward (3x forward), for the MFU metric: every
        block's projections, feed-forwards and the scores of its six attentions (``QK^T`` and ``PV``,
        ``4 Sq Sk inner_dim`` each); the two audio<->video attentions only with ``cross_modal``
        (upstream skips them under ``isolate_modalities``). Patchify, caption projections, timestep
        embeddings / modulation and the output heads are left out (about 1% at real sizes with
        per-sample timesteps). Layer shapes are read from the first block."""
        tokens = {"video": video_tokens, "audio": audio_tokens, "text": text_tokens}
        block = self.transformer_blocks[0]
        flops = 0
        for name, (query, key) in BLOCK_ATTENTIONS.items():
            if name in CROSS_MODAL_ATTENTIONS and not cross_modal:
                continue
            attn, sq, sk = getattr(block, name), tokens[query], tokens[key]
            flops += _linear_flops(attn.to_q, sq) + _linear_flops(attn.to_out[0], sq)
            flops += _linear_flops(attn.to_k, sk) + _linear_flops(attn.to_v, sk)
            if attn.to_gate_logits is not None:
                flops += _linear_flops(attn.to_gate_logits, sq)
            flops += 4 * sq * sk * attn.to_q.out_features
        for name, stream in BLOCK_FEEDFORWARDS.items():
            linears = (m for m in getattr(block, name).modules() if isinstance(m, nn.Linear))
            flops += sum(_linear_flops(m, tokens[stream]) for m in linears)
        return 3.0 * len(self.transformer_blocks) * flops

    @property
    def sequence_multiple(self) -> int:
        """Token counts that need no padding under sequence parallelism are multiples of this."""
        return self._sequence_parallel.multiple if self._sequence_parallel else 1

    def setup_context_parallel(self, parallel_state: ParallelState) -> None:
        """Sequence parallelism over the video and audio token streams (text replicated): Ulysses,
        Ring, or both (USP), through :class:`mm_parallel.SequenceParallelPlan`."""
        self._sequence_parallel = SequenceParallelPlan.from_parallel_state(parallel_state, LAYOUT)
        install_attention_processors(self.transformer_blocks, self._sequence_parallel)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Upstream forward; under sequence parallelism on this rank's token shards, outputs gathered.

        The outputs are never views (see :func:`own_storage`): this module is the FSDP2 root.
        """
        upstream = super().forward
        if self._sequence_parallel is None:
            out = upstream(*args, **kwargs)
        else:
            out = sequence_parallel_forward(self, upstream, self._sequence_parallel, *args, **kwargs)
        if isinstance(out, tuple):
            return tuple(own_storage(x) for x in out)
        out.sample, out.audio_sample = own_storage(out.sample), own_storage(out.audio_sample)
        return out


def own_storage(x: torch.Tensor) -> torch.Tensor:
    """``x``, copied when it is a view of another tensor.

    Upstream's output heads are ``nn.Linear`` layers on ``[B, S, C]`` tokens, whose output is a view
    of the 2-D matmul result. FSDP2 registers its pre-backward hook on the root's outputs, and an
    in-place op on a view (anywhere downstream, e.g. in a loss) would silently drop that hook and skip
    the backward all-gather (torch warns: "returned a view tensor"). The copy costs one output-sized
    tensor (``out_channels`` = 128 wide against the model's 4096-wide activations at real size).
    """
    return x.clone() if x._base is not None else x


def _linear_flops(linear: nn.Linear, tokens: int) -> int:
    return 2 * tokens * linear.in_features * linear.out_features


def count_parameters(module: nn.Module) -> int:
    """Number of parameter elements (works on meta modules)."""
    return sum(p.numel() for p in module.parameters())
