"""ComfyUI single files as weights sources: the ``model.diffusion_model.`` prefix, fp8 "scaled" weights
(``weight.float() * scale_weight``, ComfyUI's dequantization), marker and tokenizer entries."""

from __future__ import annotations

import pytest
import torch
from mm_checkpoint import (
    CheckpointFormatError,
    load_checkpoint_with_conversion,
    open_weights,
    save_safetensors,
)
from torch import nn


def test_a_prefixed_comfyui_dit_file_loads_under_the_models_own_names(tmp_path):
    torch.manual_seed(0)
    source = nn.Linear(3, 5)
    state = {f"model.diffusion_model.{k}": v for k, v in source.state_dict().items()}
    save_safetensors(state, tmp_path / "wan2.2_t2v_high_noise_14B_fp16.safetensors")
    model = nn.Linear(3, 5)
    assert load_checkpoint_with_conversion(
        model, tmp_path / "wan2.2_t2v_high_noise_14B_fp16.safetensors"
    ).complete
    assert torch.equal(model.weight, source.weight)


def test_scaled_fp8_weights_come_back_upcast_with_their_scales(tmp_path):
    torch.manual_seed(0)
    fp8 = (torch.randn(6, 4) * 8).to(torch.float8_e4m3fn)
    rows = (torch.randn(6, 4) * 8).to(torch.float8_e4m3fn)
    scale, row_scale = torch.tensor(0.125), torch.rand(6) + 0.5
    save_safetensors(
        {
            "scaled_fp8": torch.zeros(2, dtype=torch.float8_e4m3fn),
            "blocks.0.q.weight": fp8,
            "blocks.0.q.scale_weight": scale,
            "blocks.0.q.scale_input": torch.tensor(1.0),
            "blocks.0.k.weight": rows,
            "blocks.0.k.scale_weight": row_scale,
            "blocks.0.q.bias": torch.ones(6, dtype=torch.bfloat16),
            "spiece_model": torch.zeros(3, dtype=torch.uint8),
        },  # fmt: skip
        tmp_path / "umt5_xxl_fp8_e4m3fn_scaled.safetensors",
    )
    with open_weights(tmp_path / "umt5_xxl_fp8_e4m3fn_scaled.safetensors") as reader:
        assert sorted(reader.keys()) == ["blocks.0.k.weight", "blocks.0.q.bias", "blocks.0.q.weight"]
        assert reader.info("blocks.0.q.weight").dtype == torch.float32
        assert torch.equal(reader.read("blocks.0.q.weight"), fp8.to(torch.float32) * scale)
        assert torch.equal(
            reader.read("blocks.0.k.weight", (slice(2, 5),)), rows[2:5].float() * row_scale[2:5, None]
        )
        assert reader.read("blocks.0.q.bias").dtype == torch.bfloat16  # unscaled tensors as stored


def test_comfyuis_per_layer_quantization_format_is_refused_by_name(tmp_path):
    save_safetensors(
        {"a.weight": torch.zeros(2), "a.comfy_quant": torch.zeros(3, dtype=torch.uint8)},
        tmp_path / "q.safetensors",
    )
    with pytest.raises(CheckpointFormatError, match=r"q\.safetensors.*comfy_quant"):
        open_weights(tmp_path / "q.safetensors")


class _Blocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(3, 3) for _ in range(4))


def test_a_comfyui_file_with_a_few_foreign_tensors_is_refused_naming_them_and_the_expected_prefix(tmp_path):
    """Two stray tensors beside the prefixed model used to fail as 8 missing / 10 unexpected keys."""
    state = {f"model.diffusion_model.{k}": v for k, v in _Blocks().state_dict().items()}
    state |= {"first_stage_model.decoder.weight": torch.zeros(2), "vae_extra": torch.zeros(1)}
    save_safetensors(state, tmp_path / "bundle.safetensors")
    with pytest.raises(CheckpointFormatError) as info:
        load_checkpoint_with_conversion(_Blocks(), tmp_path / "bundle.safetensors")
    message = str(info.value)
    assert "8 of 10 tensors are under ComfyUI's diffusion-model prefix `model.diffusion_model.`" in message
    assert "these 2 are outside it: first_stage_model.decoder.weight, vae_extra" in message, message
    assert "missing" not in message


def test_an_ltx2_release_file_shows_its_diffusion_model_with_the_bundled_components_hidden(tmp_path):
    source = _Blocks()
    state = {f"model.diffusion_model.{k}": v for k, v in source.state_dict().items()}
    for component in ("vae.", "audio_vae.", "vocoder.", "text_embedding_projection."):
        state[f"{component}conv.weight"] = torch.ones(2)
    save_safetensors(state, tmp_path / "ltx-2-19b-dev.safetensors")
    with open_weights(tmp_path / "ltx-2-19b-dev.safetensors") as reader:
        assert sorted(reader.keys()) == sorted(source.state_dict())
    model = _Blocks()
    assert load_checkpoint_with_conversion(model, tmp_path / "ltx-2-19b-dev.safetensors").complete
    assert torch.equal(model.blocks[3].weight, source.blocks[3].weight)


def test_a_top_level_fp8_marker_beside_prefixed_weights_keeps_the_prefix_off(tmp_path):
    source = nn.Linear(3, 5)
    state = {f"model.diffusion_model.{k}": v for k, v in source.state_dict().items()}
    save_safetensors(
        {**state, "scaled_fp8": torch.zeros(2, dtype=torch.float8_e4m3fn)}, tmp_path / "m.safetensors"
    )
    with open_weights(tmp_path / "m.safetensors") as reader:
        assert sorted(reader.keys()) == ["bias", "weight"]
