"""``wan22-train export``: a training checkpoint's predictor -> diffusers ``transformer/`` folder, or its
LoRA adapters -> a PEFT / diffusers file, a ComfyUI file, or the base with the adapters merged."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mm_checkpoint import LORA_EXPORT_FORMATS, export_checkpoint
from mm_checkpoint import export_lora as export_lora_files
from mm_config import TrainConfig

from wan22_train.predictor import predictor_config

LORA_FORMATS = LORA_EXPORT_FORMATS
"""``--lora`` choices: diffusers ``load_lora_weights`` file, ComfyUI / official-Wan-names file, merged folder."""


def export_predictor(
    config: TrainConfig,
    checkpoint: str | Path,
    out: str | Path,
    *,
    layout: str = "diffusers",
    submodel: str = "predictor",
    ema: bool = False,
) -> Path:
    """Write a predictor of ``checkpoint`` (latest iteration) as a folder that
    ``diffusers.WanTransformer3DModel.from_pretrained`` (``layout="diffusers"``) or ``WanDiT`` loads.

    ``submodel="predictor_low"`` exports the low-noise expert of an ``expert: both`` run (the
    Wan2.2-A14B diffusers layout keeps it in ``transformer_2/``, the high-noise one in ``transformer/``).
    A LoRA run's checkpoint holds adapters only: export it with :func:`export_lora`. ``ema=True`` writes
    the EMA of the trained weights (a ``training.ema`` run) instead of their last values.
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
            ema=ema,
        )


def export_lora(
    config: TrainConfig,
    checkpoint: str | Path,
    out: str | Path,
    *,
    fmt: str,
    submodel: str = "predictor",
    ema: bool = False,
) -> Path:
    """Export the LoRA adapters of ``submodel`` in the latest iteration of ``checkpoint`` (with ``ema``:
    their EMA, a ``training.ema`` run).

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
    args = _submodel_args(config, submodel)
    if args.lora is None:
        raise ValueError(
            f"--lora: {submodel} was trained without LoRA (model.models.{submodel}.lora is unset)"
        )
    with _config_json(args, native=False) as side:
        return export_lora_files(
            checkpoint,
            out,
            fmt,
            alpha=args.lora.alpha,
            submodule=submodel,
            base=args.checkpoint_path or args.from_pretrained,
            model_type="wan2_2",  # the base: diffusers (or native) keys -> native; merged: back to diffusers
            file_model_type="wan2_2",  # PEFT file: diffusers module names; ComfyUI keeps the native ones
            config_from=side,
            ema=ema,
        )


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
