"""``wan22-train export``: a training checkpoint's predictor -> diffusers ``transformer/`` folder."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from mm_checkpoint import export_checkpoint
from mm_config import TrainConfig

from wan22_train.predictor import predictor_config


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
    """
    subs = config.model.sub_models()
    if submodel not in subs:
        raise ValueError(f"--submodel {submodel!r}: the run's sub-models are {sorted(subs)}")
    args = subs[submodel]
    wan_config = predictor_config(args)
    with tempfile.TemporaryDirectory() as side:
        native = layout == "native"
        body = wan_config.to_native() if native else wan_config.to_diffusers()
        (Path(side) / "config.json").write_text(json.dumps(body, indent=2) + "\n")
        return export_checkpoint(
            checkpoint,
            out,
            to="hf" if native else "diffusers",
            model_type=None if native else "wan2_2",
            config_from=side,
            submodule=submodel,
        )
