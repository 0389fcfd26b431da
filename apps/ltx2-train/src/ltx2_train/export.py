"""``ltx2-train export``: a training checkpoint's transformer -> diffusers ``transformer/`` folder, or its
LoRA adapters -> a PEFT / diffusers file or the base with the adapters merged.

The trainer's single-model form stores the transformer under ``model.`` with upstream keys, so the
export selects that prefix, strips it and writes diffusers safetensors plus a ``config.json`` that
``LTX2VideoTransformer3DModel.from_pretrained`` reads.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from diffusers import LTX2VideoTransformer3DModel
from mm_checkpoint import export_checkpoint, export_lora, export_single_file
from mm_config import TrainConfig

from ltx2_train.official import OFFICIAL_PREFIX, single_file_metadata
from ltx2_train.predictor import TRANSFORMER_DEFAULTS, transformer_config

LORA_FORMATS = ("peft", "comfyui", "merged")
"""``--lora`` choices: a folder for ``LTX2Pipeline.load_lora_weights``, the official LTX-2 LoRA file
(what the official trainer writes and ComfyUI loads), or a merged transformer folder."""
OFFICIAL_KEY_MAP = "ltx2"
"""mm-checkpoint's key map between the official LTX-2 module names and diffusers' (the predictor's)."""


LAYOUTS = ("diffusers", "native")
"""``--layout`` choices: a diffusers ``transformer/`` folder, or the official single ``.safetensors`` file."""


def export_transformer(
    config: TrainConfig,
    checkpoint: str | Path,
    out: str | Path,
    *,
    ema: bool = False,
    layout: str = "diffusers",
) -> Path:
    """Write the latest iteration of ``checkpoint`` as an upstream ``LTX2VideoTransformer3DModel`` folder
    (``ema``: the EMA of the trained weights, a ``training.ema`` run), or with ``layout="native"`` as the
    official single file ``out`` (``.safetensors``): ``model.diffusion_model.`` + the official names, the
    official ``config`` metadata (:mod:`ltx2_train.official`), what ``from_single_file`` and ComfyUI load."""
    if layout not in LAYOUTS:
        raise ValueError(f"--layout {layout!r}: expected one of {', '.join(LAYOUTS)}")
    args = config.model.sub_models()["model"]
    if args.lora is not None:
        raise ValueError(
            "the transformer was trained with LoRA (its checkpoint holds the adapters only): export with "
            f"--lora {{{','.join(LORA_FORMATS)}}}"
        )
    if layout == "native":
        metadata = single_file_metadata(TRANSFORMER_DEFAULTS | transformer_config(args))
        return export_single_file(
            checkpoint,
            out,
            model_type=OFFICIAL_KEY_MAP,
            key_prefix=OFFICIAL_PREFIX,
            metadata=metadata,
            submodule="model",
            ema=ema,
        )
    with _config_json(args) as side:
        return export_checkpoint(
            checkpoint, out, to="diffusers", config_from=side, submodule="model", ema=ema
        )


def export_transformer_lora(
    config: TrainConfig, checkpoint: str | Path, out: str | Path, *, fmt: str, ema: bool = False
) -> Path:
    """The LoRA adapters of ``checkpoint`` as ``fmt``: ``peft`` writes ``out/pytorch_lora_weights.safetensors``
    (``transformer.<module>.lora_A.weight`` + rank / alpha metadata); ``comfyui`` the file ``out``
    (``.safetensors``) in the official LTX-2 trainer's layout: ``diffusion_model.<official module>.lora_A.weight``
    / ``.lora_B.weight`` under the official names (``q_norm``, ``patchify_proj``, ``adaln_single``, ...;
    mm-checkpoint's ``ltx2`` map) with ``alpha / rank`` folded into ``lora_B``, since ComfyUI, ltx-core
    and diffusers' LTX-2 loader apply such a file at scale 1; ``merged`` the folder ``out``
    (``W + alpha / rank * B A`` over the base in ``model.from_pretrained``). ``ema``: the adapters' EMA."""
    if fmt not in LORA_FORMATS:
        raise ValueError(f"--lora {fmt!r}: LTX-2 exports one of {', '.join(LORA_FORMATS)}")
    args = config.model.sub_models()["model"]
    if args.lora is None:
        raise ValueError("--lora: the transformer was trained without LoRA (model.lora is unset)")
    with _config_json(args) as side:
        base = args.checkpoint_path or args.from_pretrained
        return export_lora(
            checkpoint,
            out,
            fmt,
            alpha=args.lora.alpha,
            submodule="model",
            base=base,
            config_from=side,
            ema=ema,
            comfy_model_type=OFFICIAL_KEY_MAP,
            comfy_alpha_folded=True,
        )


@contextmanager
def _config_json(args: Any) -> Iterator[str]:
    """A temporary folder holding the transformer's diffusers ``config.json``."""
    body = {"_class_name": LTX2VideoTransformer3DModel.__name__, **transformer_config(args)}
    with tempfile.TemporaryDirectory() as side:
        (Path(side) / "config.json").write_text(json.dumps(body, indent=2) + "\n")
        yield side
