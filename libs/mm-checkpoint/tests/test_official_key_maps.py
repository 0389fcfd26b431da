"""The key maps of the official Wan2.2 release files: ``wan2_1_vae``, ``wan2_2_vae`` (official VAE ->
diffusers ``AutoencoderKLWan``) and ``umt5`` (official T5 encoder -> transformers ``UMT5EncoderModel``).

The official names are pinned here as data, taken from the public Wan2.2 code (``wan/modules/vae2_1.py``,
``vae2_2.py``, ``t5.py``) and diffusers' ``scripts/convert_wan_to_diffusers.py``; the tests load weights
written under those names into the upstream classes and compare outputs, so a map is never checked
against its own inverse.
"""

from __future__ import annotations

import pytest
import torch
from mm_checkpoint import get_weight_transform, load_checkpoint_with_conversion

RESIDUAL = {"residual.0.gamma": "norm1.gamma", "residual.2.weight": "conv1.weight", "residual.2.bias": "conv1.bias",
            "residual.3.gamma": "norm2.gamma", "residual.6.weight": "conv2.weight", "residual.6.bias": "conv2.bias",
            "shortcut.weight": "conv_shortcut.weight", "shortcut.bias": "conv_shortcut.bias"}  # fmt: skip
"""Inside an official ``ResidualBlock`` (its ``residual`` Sequential) -> diffusers' ``WanResidualBlock``."""
OTHER = {"resample.1.weight", "resample.1.bias", "time_conv.weight", "time_conv.bias", "norm.gamma", "to_qkv.weight",
         "to_qkv.bias", "proj.weight", "proj.bias", "weight", "bias", "gamma"}  # fmt: skip
"""Parts whose names both layouts share."""

#: Official block -> diffusers block of the tiny Wan2.1 VAE (dim_mult [1, 2], 1 residual block, temporal
#: downsampling): the encoder keeps its flat indices, the decoder's flat ``upsamples`` (2 residual blocks
#: and an upsampler, then 2 residual blocks) become grouped ``up_blocks``.
TINY_WAN21_BLOCKS = {
    "conv1": "quant_conv", "conv2": "post_quant_conv",
    "encoder.conv1": "encoder.conv_in", "encoder.head.0": "encoder.norm_out", "encoder.head.2": "encoder.conv_out",
    "encoder.downsamples.0": "encoder.down_blocks.0", "encoder.downsamples.1": "encoder.down_blocks.1",
    "encoder.downsamples.2": "encoder.down_blocks.2",
    "encoder.middle.0": "encoder.mid_block.resnets.0", "encoder.middle.1": "encoder.mid_block.attentions.0",
    "encoder.middle.2": "encoder.mid_block.resnets.1",
    "decoder.conv1": "decoder.conv_in", "decoder.head.0": "decoder.norm_out", "decoder.head.2": "decoder.conv_out",
    "decoder.middle.0": "decoder.mid_block.resnets.0", "decoder.middle.1": "decoder.mid_block.attentions.0",
    "decoder.middle.2": "decoder.mid_block.resnets.1",
    "decoder.upsamples.0": "decoder.up_blocks.0.resnets.0", "decoder.upsamples.1": "decoder.up_blocks.0.resnets.1",
    "decoder.upsamples.2": "decoder.up_blocks.0.upsamplers.0", "decoder.upsamples.3": "decoder.up_blocks.1.resnets.0",
    "decoder.upsamples.4": "decoder.up_blocks.1.resnets.1",
}  # fmt: skip
#: The same for the tiny Wan2.2 VAE (dim_mult [1, 2, 2], 1 residual block): nested stages.
TINY_WAN22_BLOCKS = {
    **{k: v for k, v in TINY_WAN21_BLOCKS.items() if "samples." not in k},
    "encoder.downsamples.0.downsamples.0": "encoder.down_blocks.0.resnets.0",
    "encoder.downsamples.0.downsamples.1": "encoder.down_blocks.0.downsampler",
    "encoder.downsamples.1.downsamples.0": "encoder.down_blocks.1.resnets.0",
    "encoder.downsamples.1.downsamples.1": "encoder.down_blocks.1.downsampler",
    "encoder.downsamples.2.downsamples.0": "encoder.down_blocks.2.resnets.0",
    "decoder.upsamples.0.upsamples.0": "decoder.up_blocks.0.resnets.0",
    "decoder.upsamples.0.upsamples.1": "decoder.up_blocks.0.resnets.1",
    "decoder.upsamples.0.upsamples.2": "decoder.up_blocks.0.upsampler",
    "decoder.upsamples.1.upsamples.0": "decoder.up_blocks.1.resnets.0",
    "decoder.upsamples.1.upsamples.1": "decoder.up_blocks.1.resnets.1",
    "decoder.upsamples.1.upsamples.2": "decoder.up_blocks.1.upsampler",
    "decoder.upsamples.2.upsamples.0": "decoder.up_blocks.2.resnets.0",
    "decoder.upsamples.2.upsamples.1": "decoder.up_blocks.2.resnets.1",
}  # fmt: skip
#: The released Wan2.1 VAE's decoder (3 residual blocks per stage, 4 stages): diffusers' converter's indices.
RELEASED_WAN21_DECODER = {
    **{f"decoder.upsamples.{k}": f"decoder.up_blocks.{k // 4}.resnets.{k % 4}" for k in range(15) if k % 4 != 3},
    "decoder.upsamples.3": "decoder.up_blocks.0.upsamplers.0", "decoder.upsamples.7": "decoder.up_blocks.1.upsamplers.0",
    "decoder.upsamples.11": "decoder.up_blocks.2.upsamplers.0",
}  # fmt: skip
UMT5_LAYER = {"attn.q": "layer.0.SelfAttention.q", "attn.k": "layer.0.SelfAttention.k",
              "attn.v": "layer.0.SelfAttention.v", "attn.o": "layer.0.SelfAttention.o",
              "pos_embedding.embedding": "layer.0.SelfAttention.relative_attention_bias",
              "norm1": "layer.0.layer_norm", "norm2": "layer.1.layer_norm", "ffn.gate.0": "layer.1.DenseReluDense.wi_0",
              "ffn.fc1": "layer.1.DenseReluDense.wi_1", "ffn.fc2": "layer.1.DenseReluDense.wo"}  # fmt: skip
"""Official ``T5SelfAttention`` block part (``blocks.N.<part>.weight``) -> transformers' ``encoder.block.N.<part>``."""


def _official_state(model: torch.nn.Module, blocks: dict[str, str]) -> dict[str, torch.Tensor]:
    """``model``'s weights under the official names of ``blocks`` (official block -> diffusers block)."""
    by_diffusers = {v: k for k, v in blocks.items()}
    inner = {v: k for k, v in RESIDUAL.items()} | {p: p for p in OTHER}
    out = {}
    for key, value in model.state_dict().items():
        block = max((b for b in by_diffusers if key.startswith(b + ".")), key=len)
        out[f"{by_diffusers[block]}.{inner[key[len(block) + 1 :]]}"] = value
    return out


def _tiny_wan22_vae():
    from diffusers import AutoencoderKLWan

    torch.manual_seed(0)
    return AutoencoderKLWan(
        base_dim=8, decoder_base_dim=8, z_dim=4, dim_mult=[1, 2, 2], num_res_blocks=1, temperal_downsample=[False, True],
        is_residual=True, patch_size=2, in_channels=12, out_channels=12, scale_factor_temporal=2, scale_factor_spatial=8,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("make", "blocks", "model_type"),
    [("wan21", TINY_WAN21_BLOCKS, "wan2_1_vae"), ("wan22", TINY_WAN22_BLOCKS, "wan2_2_vae")],
)
def test_official_vae_weights_load_into_diffusers_and_decode_the_same(
    tiny, tmp_path, make, blocks, model_type
):
    source = (tiny.vae if make == "wan21" else _tiny_wan22_vae)().eval()
    path = tmp_path / "vae.pth"
    torch.save(_official_state(source, blocks), path)
    target = (tiny.vae if make == "wan21" else _tiny_wan22_vae)().eval()
    with torch.no_grad():
        for p in target.parameters():
            p.add_(1.0)  # so that a weight left as it was would show
    report = load_checkpoint_with_conversion(target, path, model_type=model_type)
    assert report.complete and len(report.loaded) == len(source.state_dict())
    tiny.assert_same_state(target, source)
    latents = torch.randn(1, 4, 2, 4, 4, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(target.decode(latents).sample, source.decode(latents).sample)


def test_diffusers_vae_keys_pass_through_the_official_maps(tiny):
    keys = list(tiny.vae().state_dict())
    for name in ("wan2_1_vae", "wan2_2_vae"):
        assert {k: p.sources for k, p in get_weight_transform(name).plan_load(keys).items()} == {
            k: (k,) for k in keys
        }


def test_the_released_wan21_decoder_indices_map_to_diffusers_up_blocks(tiny):
    from diffusers import AutoencoderKLWan

    keys = list(tiny.meta(AutoencoderKLWan).state_dict())  # the released Wan2.1 VAE's structure
    official = get_weight_transform("wan2_1_vae").plan_export(keys)
    blocks = {
        ".".join(k.split(".")[:3]): ".".join(p.sources[0].split(".")[:5])
        for k, p in official.items()
        if k.startswith("decoder.upsamples.")
    }
    assert blocks == RELEASED_WAN21_DECODER


def test_the_official_umt5_weights_load_into_transformers_and_encode_the_same(tiny, tmp_path):
    source = tiny.umt5()
    layers = source.config.num_layers
    official = {"token_embedding.weight": "shared.weight", "norm.weight": "encoder.final_layer_norm.weight"}
    official |= {
        f"blocks.{i}.{o}.weight": f"encoder.block.{i}.{t}.weight"
        for i in range(layers)
        for o, t in UMT5_LAYER.items()
    }
    state = source.state_dict()
    torch.save(
        {name: state[hf] for name, hf in official.items()}, tmp_path / "models_t5_umt5-xxl-enc-bf16.pth"
    )
    target = tiny.umt5()
    with torch.no_grad():
        for p in target.parameters():
            p.add_(1.0)
    report = load_checkpoint_with_conversion(
        target, tmp_path / "models_t5_umt5-xxl-enc-bf16.pth", model_type="umt5"
    )
    assert report.complete
    ids = torch.tensor([[3, 7, 1, 0]])
    with torch.no_grad():
        assert torch.equal(target(ids).last_hidden_state, source(ids).last_hidden_state)
