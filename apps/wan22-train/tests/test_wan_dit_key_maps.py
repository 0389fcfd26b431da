"""mm-checkpoint's `wan2_2` key map covers every diffusers WanTransformer3DModel key, lands on WanDiT's keys
and shapes exactly, and inverts; the app uses that one table."""

from __future__ import annotations

import pytest
import torch
from diffusers import WanTransformer3DModel
from mm_checkpoint import get_weight_transform
from wan22_train.key_maps import WAN22_KEY_MAP, diffusers_to_native, native_to_diffusers
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


def test_the_app_uses_mm_checkpoints_wan2_2_table():
    assert WAN22_KEY_MAP is get_weight_transform("wan2_2")


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
