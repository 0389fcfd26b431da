"""The `wan2_2` key map covers every diffusers WanTransformer3DModel key and inverts exactly."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from diffusers import WanTransformer3DModel
from torch.distributed.checkpoint import FileSystemReader
from wan22_train.key_maps import (
    WAN22_DIFFUSERS_TO_NATIVE,
    WAN22_KEY_MAP,
    WAN22_NATIVE_TO_DIFFUSERS,
    diffusers_to_native,
    native_to_diffusers,
)
from wan22_train.model import WanDiT, WanDiTConfig


def _diffusers_config(kind: str, **overrides) -> dict:
    base = {
        "num_attention_heads": 4,
        "attention_head_dim": 16,
        "text_dim": 24,
        "freq_dim": 32,
        "ffn_dim": 96,
        "num_layers": 12,  # two-digit block indices
        **{"t2v": {}, "i2v": {"in_channels": 36}, "ti2v": {"in_channels": 48, "out_channels": 48}}[kind],
    }
    return {**base, **overrides}


def _shapes(module: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in module.state_dict().items()}


@pytest.mark.parametrize(
    ("kind", "overrides"), [("t2v", {}), ("i2v", {}), ("ti2v", {}), ("t2v", {"cross_attn_norm": False})]
)
def test_diffusers_keys_map_onto_native_keys_and_shapes_exactly(kind, overrides):
    config = _diffusers_config(kind, **overrides)
    with torch.device("meta"):
        diffusers_shapes = _shapes(WanTransformer3DModel(**config))
        native_shapes = _shapes(WanDiT(WanDiTConfig.from_diffusers(config)))
    assert diffusers_to_native(diffusers_shapes) == native_shapes
    assert native_to_diffusers(native_shapes) == diffusers_shapes


def test_tables_are_inverse_rule_by_rule():
    assert len(WAN22_DIFFUSERS_TO_NATIVE) == len(WAN22_NATIVE_TO_DIFFUSERS)
    samples = ["blocks.17.attn1.to_out.0.weight", "blocks.3.norm2.bias", "scale_shift_table", "proj_out.bias"]
    for key in samples:
        assert WAN22_KEY_MAP.inverse(WAN22_KEY_MAP.forward(key)) == key


@pytest.mark.parametrize(
    ("diffusers_key", "native_key"),
    [
        ("condition_embedder.text_embedder.linear_1.weight", "text_embedding.0.weight"),
        ("condition_embedder.time_proj.bias", "time_projection.1.bias"),
        ("blocks.0.attn1.to_out.0.weight", "blocks.0.self_attn.o.weight"),
        ("blocks.1.attn2.norm_k.weight", "blocks.1.cross_attn.norm_k.weight"),
        ("blocks.1.norm2.weight", "blocks.1.norm3.weight"),
        ("blocks.1.ffn.net.0.proj.bias", "blocks.1.ffn.0.bias"),
        ("blocks.1.scale_shift_table", "blocks.1.modulation"),
        ("scale_shift_table", "head.modulation"),
        ("proj_out.weight", "head.head.weight"),
    ],
)
def test_documented_renames(diffusers_key, native_key):
    assert WAN22_KEY_MAP.forward(diffusers_key) == native_key


def test_native_keys_pass_through_the_registered_map():
    from mm_checkpoint import get_weight_transform

    assert get_weight_transform("wan2_2") is WAN22_KEY_MAP
    for key in [
        "blocks.1.norm3.weight",
        "head.modulation",
        "blocks.0.self_attn.q.weight",
        "text_embedding.0.bias",
    ]:
        assert WAN22_KEY_MAP.forward(key) == key


@pytest.mark.parametrize(
    "key",
    [
        "blocks.0.attn2.add_k_proj.weight",  # Wan2.1 I2V CLIP branch
        "condition_embedder.image_embedder.ff.net.0.proj.weight",
        "model.blocks.0.attn1.to_q.weight",  # an unstripped prefix must not half-match
        "blocks.0.attn1.to_q.weight_scale",
    ],
)
def test_unsupported_diffusers_key_raises_naming_it(key):
    with pytest.raises(KeyError, match=key.replace(".", r"\.")):
        diffusers_to_native({key: 0})


def test_native_key_without_rule_raises_naming_it():
    with pytest.raises(KeyError, match="img_emb"):
        native_to_diffusers({"img_emb.proj.0.weight": 0})


def test_mm_ckpt_alone_finds_the_wan2_2_map_through_its_entry_point(tmp_path):
    WanTransformer3DModel(
        num_attention_heads=2, attention_head_dim=8, ffn_dim=32, num_layers=1, text_dim=16, freq_dim=16
    ).save_pretrained(tmp_path / "diffusers")
    # a fresh process that imports no Wan module itself
    convert = "import sys; from mm_checkpoint.cli import main; sys.exit(main(sys.argv[1:]))"
    args = [str(tmp_path / "diffusers"), str(tmp_path / "dcp"), "--to", "dcp", "--model-type", "wan2_2"]
    subprocess.run(
        [sys.executable, "-c", convert, "convert", *args], check=True, capture_output=True, timeout=120
    )
    keys = FileSystemReader(str(tmp_path / "dcp" / "iter_0000000")).read_metadata().state_dict_metadata
    assert any(k.endswith("blocks.0.self_attn.q.weight") for k in keys)
    assert not any("attn1" in k or "condition_embedder" in k for k in keys)
