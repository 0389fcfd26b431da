"""training.stage_dir: each sub-model reads its weights from a node-local copy; the config keeps the sources."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from mm_checkpoint import load_checkpoint_with_conversion
from mm_config import ModelConfig
from mm_trainer.model.weight_staging import stage_model_weights
from safetensors.torch import save_file
from torch import nn


def folder(path: Path, *names: str) -> Path:
    path.mkdir(parents=True)
    for name in names:
        (path / name).write_text(name)
    return path


def test_every_sub_model_source_is_read_from_its_copy_under_the_expanded_stage_dir(tmp_path, monkeypatch):
    vae = folder(tmp_path / "shared" / "vae", "config.json", "model.safetensors")
    dit = folder(tmp_path / "shared" / "dit", "config.json", "model.safetensors")
    model = ModelConfig.model_validate(
        {
            "models": {
                "ae": {"model_id": "x", "from_pretrained": str(vae)},
                "predictor": {"model_id": "y", "checkpoint_path": str(dit)},
                "text_encoder": {"model_id": "z"},
            }
        }  # fmt: skip
    )
    monkeypatch.setenv("JOB", "job7")
    staged = stage_model_weights(model, str(tmp_path / "local" / "$JOB"))
    ae, predictor = (
        Path(staged.models["ae"].from_pretrained),
        Path(staged.models["predictor"].checkpoint_path),
    )
    assert ae.parent == predictor.parent == tmp_path / "local" / "job7"
    assert (ae / "model.safetensors").read_text() == "model.safetensors" and (
        predictor / "config.json"
    ).exists()
    assert staged.models["text_encoder"].from_pretrained is None  # no weights: nothing to stage
    assert model.models["ae"].from_pretrained == str(vae)  # the run's own config is left as it was


def converted(tmp_path: Path, fill: float) -> tuple[Path, Path]:
    """A safetensors source and its real conversion cache (recording the source's content)."""
    source = tmp_path / "shared" / "dit"
    source.mkdir(parents=True, exist_ok=True)
    save_file(
        {"weight": torch.full((2, 2), fill), "bias": torch.full((2,), fill)},
        str(source / "model.safetensors"),
    )
    cache = tmp_path / "shared" / "cache"
    load_checkpoint_with_conversion(nn.Linear(2, 2), source, fmt="dcp", conversion_dir=cache)
    return source, cache


def dcp_sub(source: Path, cache: Path) -> dict:
    return {"model_id": "y", "from_pretrained": str(source), "load_format": "dcp",
            "checkpoint_conversion_dir": str(cache)}  # fmt: skip


def test_a_complete_dcp_cache_is_staged_in_place_of_the_safetensors_source(tmp_path):
    source, cache = converted(tmp_path, 1.0)
    staged = stage_model_weights(ModelConfig.model_validate(dcp_sub(source, cache)), str(tmp_path / "local"))
    assert staged.from_pretrained == str(source)  # the identity check still reads the source
    assert (Path(staged.checkpoint_conversion_dir) / "iter_0000000" / ".metadata").exists()


def test_a_cache_of_an_older_content_of_the_source_is_left_on_shared_storage_to_be_converted_again(tmp_path):
    source, cache = converted(tmp_path, 1.0)
    weights = source / "model.safetensors"
    stamp = weights.stat()
    save_file({"weight": torch.full((2, 2), 2.0), "bias": torch.full((2,), 2.0)}, str(weights))  # same size
    os.utime(weights, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))  # and the same modification time
    sub = dcp_sub(source, cache)
    staged = stage_model_weights(ModelConfig.model_validate(sub), str(tmp_path / "local"))
    assert staged == ModelConfig.model_validate(sub) and not (tmp_path / "local").exists()


def test_an_incomplete_dcp_cache_is_left_on_shared_storage_for_the_conversion(tmp_path):
    source = folder(tmp_path / "shared" / "dit", "config.json", "model.safetensors")
    sub = {"model_id": "y", "from_pretrained": str(source), "load_format": "dcp",
           "checkpoint_conversion_dir": str(tmp_path / "shared" / "cache")}  # fmt: skip
    staged = stage_model_weights(ModelConfig.model_validate(sub), str(tmp_path / "local"))
    assert staged == ModelConfig.model_validate(sub) and not (tmp_path / "local").exists()
