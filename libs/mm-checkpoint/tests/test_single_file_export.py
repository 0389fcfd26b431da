"""``export_single_file``: a checkpoint's model (or one sub-model) as ONE safetensors file, keys mapped back
through a key map and prefixed, metadata in its header."""

from __future__ import annotations

import pytest
import torch
from mm_checkpoint import (
    KEY_MAP_REGISTRY,
    CheckpointFormatError,
    DistributedCheckpointer,
    KeyMapTransform,
    RenameRule,
    export_single_file,
    register_weight_transform,
)
from safetensors import safe_open
from safetensors.torch import load_file
from torch import nn

# checkpoint side `blocks.<i>.attn.q.` <-> model side `blocks.<i>.q.`
MAP = KeyMapTransform([RenameRule(r"^blocks\.(\d+)\.attn\.q\.", r"blocks.\1.q.")])


@pytest.fixture
def key_map():
    register_weight_transform("single_file_test_map", MAP)
    yield "single_file_test_map"
    KEY_MAP_REGISTRY.pop("single_file_test_map")


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Module() for _ in range(2))
        for block in self.blocks:
            block.q = nn.Linear(3, 4)
        self.head = nn.Linear(4, 2)


def _run(tmp_path) -> tuple:
    holder = nn.Module()
    holder.add_module("predictor", _Model())
    holder.add_module("critic", nn.Linear(2, 2))
    DistributedCheckpointer(tmp_path / "ckpt").save({"model": holder}, 2)
    return tmp_path / "ckpt", holder.predictor


def test_the_sub_models_tensors_come_out_renamed_prefixed_and_with_the_metadata(tmp_path, key_map):
    ckpt, model = _run(tmp_path)
    out = export_single_file(
        ckpt, tmp_path / "m.safetensors", model_type=key_map, key_prefix="model.diffusion_model.",
        metadata={"config": '{"transformer": {}}'}, submodule="predictor",
    )  # fmt: skip
    state = load_file(out)
    want = {f"model.diffusion_model.blocks.{i}.attn.q.{p}" for i in (0, 1) for p in ("weight", "bias")}
    assert set(state) == want | {"model.diffusion_model.head.weight", "model.diffusion_model.head.bias"}
    assert torch.equal(state["model.diffusion_model.blocks.1.attn.q.weight"], model.blocks[1].q.weight)
    with safe_open(str(out), "pt") as f:
        assert f.metadata() == {"format": "pt", "config": '{"transformer": {}}'}


def test_a_single_file_export_is_a_safetensors_file(tmp_path):
    ckpt, _ = _run(tmp_path)
    with pytest.raises(CheckpointFormatError, match=r"single-file export is written as a \.safetensors file"):
        export_single_file(ckpt, tmp_path / "out", submodule="predictor")
    assert not (tmp_path / "out").exists()
