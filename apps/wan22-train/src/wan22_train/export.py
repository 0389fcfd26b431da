"""``wan22-train export``: a training checkpoint's predictor -> diffusers ``transformer/`` folder, or its
LoRA adapters -> a PEFT / diffusers file, a ComfyUI file, or the base with the adapters merged."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mm_checkpoint import (
    export_checkpoint,
    export_merged,
    read_lora_adapters,
    save_comfy_lora,
    save_peft_lora,
)
from mm_config import TrainConfig

from wan22_train.predictor import predictor_config

LORA_FORMATS = ("peft", "comfyui", "merged")
"""``--lora`` choices: diffusers ``load_lora_weights`` file, ComfyUI / official-Wan-names file, merged folder."""
PEFT_WEIGHT_NAME = "pytorch_lora_weights.safetensors"
"""The file name diffusers' ``load_lora_weights(folder)`` looks for."""


def export_predictor(
    config: TrainConfig,
    checkpoint: str | Path,
    out: str | Path,
    *,
    layout: str = "diffusers",
    submodel: str = "predictor",
) -> Path:
    """Write a predictor of ``checkpoint`` (latest iteration) as a folder that
    ``diffusers.WanTransformer3DModel.from_pretrained`` (``layout="diffusers"``) or ``WanDiT`` loads.

    ``submodel="predictor_low"`` exports the low-noise expert of an ``expert: both`` run (the
    Wan2.2-A14B diffusers layout keeps it in ``transformer_2/``, the high-noise one in ``transformer/``).
    A LoRA run's checkpoint holds adapters only: export it with :func:`export_lora`.
    """
    args = _submodel_args(config, submodel)
    if args.lora is not None:
        raise ValueError(
            f"{submodel} was trained with LoRA (its checkpoint holds the adapters only): export with "
            f"--lora {{{','.join(LORA_FORMATS)}}}"
        )
    native = layout == "native"
    with _config_json(args, native=native) as side:
        return export_checkpoint(
            checkpoint,
            out,
            to="hf" if native else "diffusers",
            model_type=None if native else "wan2_2",
            config_from=side,
            submodule=submodel,
        )


def export_lora(
    config: TrainConfig, checkpoint: str | Path, out: str | Path, *, fmt: str, submodel: str = "predictor"
) -> Path:
    """Export the LoRA adapters of ``submodel`` in the latest iteration of ``checkpoint``.

    ``fmt``:
      - ``peft``: ``out/pytorch_lora_weights.safetensors`` with diffusers keys
        (``transformer.blocks.0.attn1.to_q.lora_A.weight``) and the rank / alpha in its metadata, for
        ``WanPipeline.load_lora_weights(out)``;
      - ``comfyui``: the file ``out`` (``.safetensors``) with the official Wan module names ComfyUI's Wan
        model uses (``diffusion_model.blocks.0.self_attn.q.lora_down.weight``, ``lora_up``, ``alpha``);
      - ``merged``: the folder ``out``, a diffusers ``WanTransformer3DModel`` whose adapted weights are
        ``W + alpha / rank * B A`` (the base read from the sub-model's ``checkpoint_path`` /
        ``from_pretrained``).
    """
    if fmt not in LORA_FORMATS:
        raise ValueError(f"--lora {fmt!r}: expected one of {', '.join(LORA_FORMATS)}")
    args = _submodel_args(config, submodel)
    if args.lora is None:
        raise ValueError(
            f"--lora: {submodel} was trained without LoRA (model.models.{submodel}.lora is unset)"
        )
    adapters = read_lora_adapters(checkpoint, alpha=args.lora.alpha, submodule=submodel)
    if fmt == "peft":
        return save_peft_lora(
            adapters, Path(out) / PEFT_WEIGHT_NAME, prefix="transformer.", model_type="wan2_2"
        )
    if fmt == "comfyui":
        return save_comfy_lora(adapters, out, prefix="diffusion_model.")
    with _config_json(args, native=False) as side:
        base = args.checkpoint_path or args.from_pretrained
        return export_merged(base, adapters, out, to="diffusers", model_type="wan2_2", config_from=side)


def _submodel_args(config: TrainConfig, submodel: str) -> Any:
    subs = config.model.sub_models()
    if submodel not in subs:
        raise ValueError(f"--submodel {submodel!r}: the run's sub-models are {sorted(subs)}")
    return subs[submodel]


@contextmanager
def _config_json(args: Any, *, native: bool) -> Iterator[str]:
    """A temporary folder holding the predictor's ``config.json`` (diffusers or native layout)."""
    wan = predictor_config(args)
    body = wan.to_native() if native else wan.to_diffusers()
    with tempfile.TemporaryDirectory() as side:
        (Path(side) / "config.json").write_text(json.dumps(body, indent=2) + "\n")
        yield side
