"""``ltx2-train export``: a training checkpoint's transformer -> diffusers ``transformer/`` folder.

The trainer's single-model form stores the transformer under ``model.`` with upstream keys, so the
export selects that prefix, strips it and writes diffusers safetensors plus a ``config.json`` that
``LTX2VideoTransformer3DModel.from_pretrained`` reads.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from diffusers import LTX2VideoTransformer3DModel
from mm_checkpoint import export_checkpoint
from mm_config import TrainConfig

from ltx2_train.predictor import transformer_config


def export_transformer(config: TrainConfig, checkpoint: str | Path, out: str | Path) -> Path:
    """Write the latest iteration of ``checkpoint`` as an upstream ``LTX2VideoTransformer3DModel`` folder."""
    args = config.model.sub_models()["model"]
    body = {"_class_name": LTX2VideoTransformer3DModel.__name__, **transformer_config(args)}
    with tempfile.TemporaryDirectory() as side:
        (Path(side) / "config.json").write_text(json.dumps(body, indent=2) + "\n")
        return export_checkpoint(checkpoint, out, to="diffusers", config_from=side, submodule="model")
