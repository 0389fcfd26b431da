"""The EMA of the trainable parameters in a training checkpoint (``ema``): saved, restored, exported."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest
import torch
from mm_checkpoint import (
    CheckpointFormatError,
    CheckpointLoadError,
    DistributedCheckpointer,
    export_checkpoint,
    read_dcp_metadata,
    read_lora_adapters,
)
from safetensors.torch import load_file
from torch import nn


class Averages:
    """The form the checkpointer saves as ``ema``: ``state_dict()`` of tensors under model keys."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self.tensors = tensors

    def state_dict(self) -> dict[str, torch.Tensor]:
        return dict(self.tensors)

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        for key, value in state.items():
            self.tensors[key].copy_(value)


def _model(dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 2)).to(dtype)
    model[1].requires_grad_(False)  # frozen: no average
    return model


def _averages(model: nn.Module, fill: float | None = None) -> Averages:
    g = torch.Generator().manual_seed(1)
    return Averages(
        {
            k: torch.full(p.shape, fill) if fill is not None else torch.randn(p.shape, generator=g)
            for k, p in model.named_parameters()
            if p.requires_grad
        }
    )


def _save(root: Path, model: nn.Module, ema: Averages | None) -> Path:
    DistributedCheckpointer(root).save({"model": model, "ema": ema}, 4)
    return root


def test_the_average_is_saved_through_dcp_beside_the_weights_and_restored(tmp_path):
    model = _model()
    saved = _averages(model)
    root = _save(tmp_path / "ckpt", model, saved)
    stored = read_dcp_metadata(root / "iter_0000004").state_dict_metadata
    # DCP entries (resharded on load like the weights), not per-rank state
    assert {k for k in stored if k.startswith("ema.")} == {f"ema.{k}" for k in saved.tensors}
    restored = _averages(model, fill=0.0)
    DistributedCheckpointer(root).load({"model": _model(), "ema": restored})
    assert restored.tensors.keys() == saved.tensors.keys()
    assert all(torch.equal(restored.tensors[k], v) for k, v in saved.tensors.items())


def test_asking_for_an_average_a_checkpoint_lacks_is_refused(tmp_path):
    model = _model()
    root = _save(tmp_path / "ckpt", model, None)
    with pytest.raises(CheckpointLoadError, match=r"has no \['ema'\] state"):
        DistributedCheckpointer(root).load({"model": model, "ema": _averages(model)})


def test_export_with_ema_writes_the_averages_and_the_saved_frozen_tensors_in_the_models_dtype(tmp_path):
    model = _model(torch.bfloat16)
    averages = _averages(model)
    root = _save(tmp_path / "ckpt", model, averages)
    written = load_file(
        export_checkpoint(root, tmp_path / "out", to="safetensors", ema=True) / "model.safetensors"
    )
    assert written.keys() == model.state_dict().keys()
    for key, value in model.state_dict().items():
        expected = averages.tensors[key].to(torch.bfloat16) if key in averages.tensors else value
        assert written[key].dtype == torch.bfloat16 and torch.equal(written[key], expected), key
    assert not torch.equal(written["0.weight"], model.state_dict()["0.weight"])


def test_export_without_ema_of_a_checkpoint_holding_one_writes_the_raw_weights(tmp_path):
    model = _model()
    root = _save(tmp_path / "ckpt", model, _averages(model))
    written = load_file(export_checkpoint(root, tmp_path / "out", to="safetensors") / "model.safetensors")
    assert written.keys() == model.state_dict().keys()
    assert all(torch.equal(written[k], v) for k, v in model.state_dict().items())


def test_export_with_ema_of_a_checkpoint_without_one_is_refused(tmp_path):
    root = _save(tmp_path / "ckpt", _model(), None)
    with pytest.raises(CheckpointFormatError, match="holds no EMA weights .* trained without training.ema"):
        export_checkpoint(root, tmp_path / "out", to="safetensors", ema=True)


def test_lora_adapters_read_with_ema_are_their_averages(tmp_path):
    adapters = nn.Module()
    adapters.q = nn.Module()
    adapters.q.lora_A = nn.ModuleDict({"default": nn.Linear(6, 2, bias=False)})
    adapters.q.lora_B = nn.ModuleDict({"default": nn.Linear(2, 5, bias=False)})
    averages = _averages(adapters)
    root = _save(tmp_path / "ckpt", adapters, averages)
    (layer,) = read_lora_adapters(root, alpha=2.0, ema=True).values()
    assert torch.equal(layer.down, averages.tensors["q.lora_A.default.weight"])
    assert torch.equal(layer.up, averages.tensors["q.lora_B.default.weight"])
