"""WanDiTConfig: diffusers / native config.json mapping, presets, and clear errors."""

from __future__ import annotations

import json

import pytest
import torch
from wan22_train.model import WanDiT, WanDiTConfig

DIFFUSERS_TI2V_5B = {  # diffusers Wan2.2-TI2V-5B transformer/config.json
    "_class_name": "WanTransformer3DModel",
    "_diffusers_version": "0.35.0.dev0",
    "added_kv_proj_dim": None,
    "attention_head_dim": 128,
    "cross_attn_norm": True,
    "eps": 1e-06,
    "ffn_dim": 14336,
    "freq_dim": 256,
    "image_dim": None,
    "in_channels": 48,
    "num_attention_heads": 24,
    "num_layers": 30,
    "out_channels": 48,
    "patch_size": [1, 2, 2],
    "pos_embed_seq_len": None,
    "qk_norm": "rms_norm_across_heads",
    "rope_max_seq_len": 1024,
    "text_dim": 4096,
}


def test_from_diffusers_reads_every_shape_field():
    config = WanDiTConfig.from_diffusers(DIFFUSERS_TI2V_5B)
    assert config == WanDiTConfig.ti2v_5b()
    assert config.head_dim == 128 and config.model_type == "ti2v"


@pytest.mark.parametrize(("in_channels", "model_type"), [(16, "t2v"), (36, "i2v"), (48, "ti2v")])
def test_from_diffusers_guesses_model_type_from_in_channels(in_channels, model_type):
    config = {**DIFFUSERS_TI2V_5B, "in_channels": in_channels, "out_channels": None}
    parsed = WanDiTConfig.from_diffusers(config)
    assert parsed.model_type == model_type and parsed.out_dim == in_channels


@pytest.mark.parametrize("preset", ["t2v_a14b", "i2v_a14b", "ti2v_5b"])
def test_presets_round_trip_through_diffusers_and_native_json(preset):
    config = getattr(WanDiTConfig, preset)()
    assert WanDiTConfig.from_diffusers(json.loads(json.dumps(config.to_diffusers()))) == config
    assert WanDiTConfig.from_json_dict(json.loads(json.dumps(config.to_native()))) == config


@pytest.mark.parametrize(("preset", "billions"), [("t2v_a14b", 14.29), ("i2v_a14b", 14.29), ("ti2v_5b", 5.0)])
def test_presets_have_the_published_parameter_counts(preset, billions):
    with torch.device("meta"):
        model = WanDiT(getattr(WanDiTConfig, preset)())
    assert sum(p.numel() for p in model.parameters()) / 1e9 == pytest.approx(billions, abs=0.05)


def test_native_official_config_is_read():
    official = {  # Wan2.2-I2V-A14B high_noise_model/config.json
        "_class_name": "WanModel",
        "_diffusers_version": "0.33.0",
        "dim": 5120,
        "eps": 1e-06,
        "ffn_dim": 13824,
        "freq_dim": 256,
        "in_dim": 36,
        "model_type": "i2v",
        "num_heads": 40,
        "num_layers": 40,
        "out_dim": 16,
        "text_len": 512,
    }
    assert WanDiTConfig.from_json_dict(official) == WanDiTConfig.i2v_a14b()


@pytest.mark.parametrize("key", ["image_dim", "added_kv_proj_dim", "pos_embed_seq_len"])
def test_from_diffusers_rejects_clip_image_branch_naming_the_key(key):
    with pytest.raises(ValueError, match=key):
        WanDiTConfig.from_diffusers({**DIFFUSERS_TI2V_5B, key: 1280})


def test_from_diffusers_rejects_unknown_key():
    with pytest.raises(ValueError, match="window_size_typo"):
        WanDiTConfig.from_diffusers({**DIFFUSERS_TI2V_5B, "window_size_typo": 3})


def test_native_config_rejects_unknown_key():
    with pytest.raises(ValueError, match="num_head'"):
        WanDiTConfig.from_native({"num_head": 4})


def test_heads_must_divide_dim():
    with pytest.raises(ValueError, match="num_heads=7"):
        WanDiTConfig(dim=64, num_heads=7)
