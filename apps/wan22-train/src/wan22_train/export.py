"""``wan22-train export``: a training checkpoint's predictor -> a diffusers ``transformer/`` folder or an
official-layout (native) folder, or its LoRA adapters -> a PEFT / diffusers file, a ComfyUI file, or the
base with the adapters merged; for a two-expert (``expert: both``) run, the pair of one file per expert."""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mm_checkpoint import export_checkpoint
from mm_checkpoint import export_lora as export_lora_files
from mm_config import TrainConfig

from wan22_train.export_options import EXPERT_CHOICES, LORA_FORMATS
from wan22_train.pipeline import LOW_NOISE_ROLE
from wan22_train.predictor import predictor_config, predictor_source

logger = logging.getLogger(__name__)

EXPERT_SUBMODELS: dict[str, str] = {"high": "predictor", "low": LOW_NOISE_ROLE}
"""The sub-model of each A14B expert in an ``expert: both`` run."""
PAIR_NAMES: dict[str, str] = {"high": "high_noise_model", "low": "low_noise_model"}
"""The ecosystem's names of an A14B pair (the official release's expert folders; LoRA pairs such as
``lightx2v/Wan2.2-Lightning``'s ``high_noise_model.safetensors`` / ``low_noise_model.safetensors``)."""


def export_predictor(
    config: TrainConfig,
    checkpoint: str | Path,
    out: str | Path,
    *,
    layout: str = "diffusers",
    submodel: str = "predictor",
    ema: bool = False,
    max_shard_size: int | str = "5GB",
) -> Path:
    """Write a predictor of ``checkpoint`` (latest iteration) as a folder that
    ``diffusers.WanTransformer3DModel.from_pretrained`` (``layout="diffusers"``) or the official Wan code
    (``layout="native"``: ``WanModel.from_pretrained``, ComfyUI) loads.

    Both layouts name their weights ``diffusion_pytorch_model.safetensors``, or above ``max_shard_size``
    ``diffusion_pytorch_model-0000N-of-0000M.safetensors`` with ``diffusion_pytorch_model.safetensors.index.json``
    (what the official release ships); the native ``config.json`` is the release's
    (:meth:`~wan22_train.model.WanDiTConfig.to_native`), keys in the official names.

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
    if native and (odd := predictor_config(args).official_mismatches()):
        logger.warning(
            "%s: %s differ from the official WanModel's fixed values; the official code cannot load this "
            "export (this project's loaders can: config.json records them)", submodel, odd,
        )  # fmt: skip
    with _config_json(args, native=native) as side:
        return export_checkpoint(
            checkpoint,
            out,
            to="diffusers",
            model_type=None if native else "wan2_2",
            config_from=side,
            max_shard_size=max_shard_size,
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
            base=predictor_source(args),
            model_type="wan2_2",  # the base: diffusers (or native) keys -> native; merged: back to diffusers
            file_model_type="wan2_2",  # PEFT file: diffusers module names; ComfyUI keeps the native ones
            config_from=side,
            ema=ema,
        )


def export_lora_pair(
    config: TrainConfig,
    checkpoint: str | Path,
    out: str | Path,
    *,
    fmt: str,
    expert: str = "both",
    ema: bool = False,
) -> list[Path]:
    """The LoRA adapters of an ``expert: both`` run, one export per expert, named by the ecosystem's
    convention inside the folder ``out``: ``high_noise_model`` (the high-noise expert, ``predictor``) and
    ``low_noise_model`` (``predictor_low``); ``expert`` ``high`` or ``low`` writes one of them.

    ``comfyui``: ``out/high_noise_model.safetensors`` + ``out/low_noise_model.safetensors`` (ComfyUI: each
    in a LoraLoaderModelOnly on its own expert's model). ``peft``: ``out/high_noise_model/`` and
    ``out/low_noise_model/``, each with ``pytorch_lora_weights.safetensors`` (diffusers' ``WanPipeline``:
    ``load_lora_weights(out/high_noise_model)`` for ``transformer``, ``load_lora_weights(out/low_noise_model,
    load_into_transformer_2=True)`` for ``transformer_2``). ``merged``: the two merged transformer folders.
    """
    subs = config.model.sub_models()
    missing = [s for s in EXPERT_SUBMODELS.values() if s not in subs]
    if missing:
        raise ValueError(
            f"--expert: a LoRA pair comes from a run with both A14B experts (model.pipeline.expert: both, "
            f"sub-models {sorted(EXPERT_SUBMODELS.values())}); this run has {sorted(subs)}"
        )
    if expert not in EXPERT_CHOICES:
        raise ValueError(f"--expert {expert!r}: expected one of {', '.join(EXPERT_CHOICES)}")
    out = Path(out)
    written = []
    for name in ("high", "low") if expert == "both" else (expert,):
        target = out / (PAIR_NAMES[name] + (".safetensors" if fmt == "comfyui" else ""))
        written.append(
            export_lora(config, checkpoint, target, fmt=fmt, submodel=EXPERT_SUBMODELS[name], ema=ema)
        )
    return written


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
