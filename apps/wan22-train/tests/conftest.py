"""Fixtures for WanDiT tests: tiny random-weight diffusers `WanTransformer3DModel`s saved to disk, and inputs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

# Tiny but non-trivial: 2 blocks, 4 heads of 16 channels (RoPE split 8/4/4), qk + cross-attention norms.
TINY_DIFFUSERS = {
    "patch_size": [1, 2, 2],
    "num_attention_heads": 4,
    "attention_head_dim": 16,
    "in_channels": 16,
    "out_channels": 16,
    "text_dim": 24,
    "freq_dim": 32,
    "ffn_dim": 96,
    "num_layers": 2,
    "cross_attn_norm": True,
    "qk_norm": "rms_norm_across_heads",
    "eps": 1e-6,
    "rope_max_seq_len": 64,
}
KINDS = {
    "t2v": {},
    "i2v": {"in_channels": 36},  # 16 noise + 4 mask + 16 image latents (Wan2.2 I2V-A14B layout)
    "ti2v": {"in_channels": 48, "out_channels": 48},  # Wan2.2 VAE latents (TI2V-5B layout)
}
LATENT_FHW = (3, 8, 12)  # post-patch grid 3 x 4 x 6: non-cubic, 72 tokens
TEXT_LEN = 7


def tiny_diffusers_config(kind: str, **overrides) -> dict:
    """The tiny diffusers config.json dict of one model kind."""
    return {**TINY_DIFFUSERS, **KINDS[kind], **overrides}


@pytest.fixture
def diffusers_wan(tmp_path: Path) -> Callable[..., tuple[torch.nn.Module, Path]]:
    """Factory `(kind, **config_overrides) -> (diffusers model in eval mode, folder it was saved to)`.

    Every parameter (norm weights, biases, modulation tables included) is perturbed with randn so no
    term is trivially zero or one; the model is saved with `save_pretrained` (sharded on request).
    """
    from diffusers import WanTransformer3DModel

    def make(kind: str = "t2v", *, seed: int = 0, max_shard_size: str | None = None, **overrides):
        torch.manual_seed(seed)
        model = WanTransformer3DModel(**tiny_diffusers_config(kind, **overrides)).eval()
        with torch.no_grad():
            for param in model.parameters():
                param.add_(0.2 * torch.randn_like(param))
        folder = tmp_path / f"diffusers_{kind}_{seed}"
        kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
        model.save_pretrained(folder, **kwargs)
        return model, folder

    return make


@pytest.fixture
def wan_inputs() -> Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Factory `(in_channels, batch=2, seed=1) -> (hidden_states, timestep [B], encoder_hidden_states)`."""

    def make(in_channels: int, batch: int = 2, seed: int = 1):
        gen = torch.Generator().manual_seed(seed)
        hidden = torch.randn(batch, in_channels, *LATENT_FHW, generator=gen)
        timestep = torch.tensor([999.0, 312.5, 3.0, 640.0][:batch])
        text = torch.randn(batch, TEXT_LEN, TINY_DIFFUSERS["text_dim"], generator=gen)
        return hidden, timestep, text

    return make


# --------------------------------------------------------------------------------------------------
# The official Wan2.2 release layout, written from a tiny -Diffusers folder. The names are taken from the
# public Wan2.2 code (wan/modules/vae2_1.py, vae2_2.py, t5.py, model.py; wan/configs/*.py) and written
# here on their own, independently of mm-checkpoint's key maps, so that loading them tests those maps.

_RESIDUAL_PARTS = {"norm1": "residual.0", "conv1": "residual.2", "norm2": "residual.3", "conv2": "residual.6",
                   "conv_shortcut": "shortcut"}  # fmt: skip
"""diffusers' WanResidualBlock part -> the official ResidualBlock's ``residual`` Sequential index."""


def official_vae_blocks(*, residual: bool, stages: int, num_res_blocks: int) -> dict[str, str]:
    """diffusers ``AutoencoderKLWan`` block path -> the official VAE's, built by the official modules'
    own loops (Encoder3d / Decoder3d of vae2_1.py, or of vae2_2.py when ``residual``)."""
    blocks = {"quant_conv": "conv1", "post_quant_conv": "conv2"}
    for side in ("encoder", "decoder"):
        blocks |= {f"{side}.conv_in": f"{side}.conv1", f"{side}.norm_out": f"{side}.head.0",
                   f"{side}.conv_out": f"{side}.head.2", f"{side}.mid_block.resnets.0": f"{side}.middle.0",
                   f"{side}.mid_block.attentions.0": f"{side}.middle.1", f"{side}.mid_block.resnets.1": f"{side}.middle.2"}  # fmt: skip
    k = 0
    for i in range(
        stages
    ):  # encoder: num_res_blocks residual blocks, then a downsample but after the last stage
        for j in range(num_res_blocks):
            if residual:
                blocks[f"encoder.down_blocks.{i}.resnets.{j}"] = f"encoder.downsamples.{i}.downsamples.{j}"
            else:
                blocks[f"encoder.down_blocks.{k}"], k = f"encoder.downsamples.{k}", k + 1
        if i != stages - 1:
            if residual:
                blocks[f"encoder.down_blocks.{i}.downsampler"] = (
                    f"encoder.downsamples.{i}.downsamples.{num_res_blocks}"
                )
            else:
                blocks[f"encoder.down_blocks.{k}"], k = f"encoder.downsamples.{k}", k + 1
    k = 0
    for i in range(
        stages
    ):  # decoder: num_res_blocks + 1 residual blocks, then an upsample but after the last
        for j in range(num_res_blocks + 1):
            if residual:
                blocks[f"decoder.up_blocks.{i}.resnets.{j}"] = f"decoder.upsamples.{i}.upsamples.{j}"
            else:
                blocks[f"decoder.up_blocks.{i}.resnets.{j}"], k = f"decoder.upsamples.{k}", k + 1
        if i != stages - 1:
            if residual:
                blocks[f"decoder.up_blocks.{i}.upsampler"] = (
                    f"decoder.upsamples.{i}.upsamples.{num_res_blocks + 1}"
                )
            else:
                blocks[f"decoder.up_blocks.{i}.upsamplers.0"], k = f"decoder.upsamples.{k}", k + 1
    return blocks


def official_vae_state(vae) -> dict[str, torch.Tensor]:
    """A diffusers ``AutoencoderKLWan``'s weights under the official names of its depth."""
    cfg = vae.config
    blocks = official_vae_blocks(
        residual=bool(cfg.is_residual), stages=len(cfg.dim_mult), num_res_blocks=cfg.num_res_blocks
    )
    out = {}
    for key, value in vae.state_dict().items():
        block = max((b for b in blocks if key.startswith(b + ".")), key=len)
        part, dot, rest = key[len(block) + 1 :].partition(".")
        out[f"{blocks[block]}.{_RESIDUAL_PARTS.get(part, part)}{dot}{rest}"] = value.clone()
    return out


_UMT5_PARTS = {"layer.0.SelfAttention.q": "attn.q", "layer.0.SelfAttention.k": "attn.k",
               "layer.0.SelfAttention.v": "attn.v", "layer.0.SelfAttention.o": "attn.o",
               "layer.0.SelfAttention.relative_attention_bias": "pos_embedding.embedding",
               "layer.0.layer_norm": "norm1", "layer.1.layer_norm": "norm2",
               "layer.1.DenseReluDense.wi_0": "ffn.gate.0", "layer.1.DenseReluDense.wi_1": "ffn.fc1",
               "layer.1.DenseReluDense.wo": "ffn.fc2"}  # fmt: skip
"""transformers ``UMT5EncoderModel`` block part -> the official ``T5SelfAttention`` block's (t5.py)."""


def official_umt5_state(encoder) -> dict[str, torch.Tensor]:
    """A transformers ``UMT5EncoderModel``'s weights under the official ``T5Encoder`` names."""
    out = {}
    for key, value in encoder.state_dict().items():
        if key == "encoder.embed_tokens.weight":
            continue  # tied to shared: the official encoder has one token_embedding
        if key in ("shared.weight", "encoder.final_layer_norm.weight"):
            out[{"shared.weight": "token_embedding.weight"}.get(key, "norm.weight")] = value.clone()
            continue
        _, _, index, rest = key.split(".", 3)
        part = rest.removesuffix(".weight")
        out[f"blocks.{index}.{_UMT5_PARTS[part]}.weight"] = value.clone()
    return out


def official_dit_config(diffusers_config: dict) -> dict:
    """The config.json an official release holds for a DiT of this shape: the keys ``WanModel`` stores
    (``ignore_for_config`` keeps text_dim, qk_norm, cross_attn_norm, patch_size, window_size out)."""
    heads = diffusers_config["num_attention_heads"]
    model_type = {36: "i2v", 48: "ti2v"}.get(diffusers_config["in_channels"], "t2v")
    return {"_class_name": "WanModel", "_diffusers_version": "0.33.0", "model_type": model_type, "text_len": 512,
            "in_dim": diffusers_config["in_channels"], "dim": heads * diffusers_config["attention_head_dim"],
            "ffn_dim": diffusers_config["ffn_dim"], "freq_dim": diffusers_config["freq_dim"],
            "out_dim": diffusers_config["out_channels"], "num_heads": heads,
            "num_layers": diffusers_config["num_layers"], "eps": diffusers_config["eps"]}  # fmt: skip


def write_official_dit(diffusers_folder: Path, out: Path, shards: int = 2) -> Path:
    """An official expert folder from a diffusers ``transformer/``: native names in ``shards``
    ``diffusion_pytorch_model-0000N-of-0000M.safetensors`` + their index + the official config.json."""
    import json

    from diffusers import WanTransformer3DModel
    from safetensors.torch import save_file
    from wan22_train.key_maps import diffusers_to_native

    model = WanTransformer3DModel.from_pretrained(diffusers_folder)
    state = {k: v.contiguous() for k, v in diffusers_to_native(model.state_dict()).items()}
    out.mkdir(parents=True)
    keys = sorted(state)
    names = [f"diffusion_pytorch_model-{n:05d}-of-{shards:05d}.safetensors" for n in range(1, shards + 1)]
    weight_map = {}
    for n, name in enumerate(names):
        part = keys[n::shards]
        save_file({k: state[k] for k in part}, str(out / name))
        weight_map |= {k: name for k in part}
    total = sum(v.numel() * v.element_size() for v in state.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps(index))
    (out / "config.json").write_text(json.dumps(official_dit_config(dict(model.config))))
    return out


def write_official_release(diffusers_root: Path, out: Path, *, experts: bool = True) -> Path:
    """The official release layout of a tiny ``-Diffusers`` root: ``high_noise_model/`` +
    ``low_noise_model/`` (or, ``experts=False``, the TI2V-5B DiT at the root), ``Wan2.1_VAE.pth``
    (``Wan2.2_VAE.pth`` for a residual VAE), ``models_t5_umt5-xxl-enc-bf16.pth`` (fp32 here, so both layouts
    hold the same numbers) and the ``google/umt5-xxl`` tokenizer folder."""
    import shutil

    from diffusers import AutoencoderKLWan
    from transformers import UMT5EncoderModel

    out.mkdir(parents=True)
    if experts:
        write_official_dit(diffusers_root / "transformer", out / "high_noise_model")
        write_official_dit(diffusers_root / "transformer_2", out / "low_noise_model")
    else:
        for f in write_official_dit(diffusers_root / "transformer", out / "dit").iterdir():
            f.rename(out / f.name)
        (out / "dit").rmdir()
    vae = AutoencoderKLWan.from_pretrained(diffusers_root / "vae")
    name = "Wan2.2_VAE.pth" if vae.config.is_residual else "Wan2.1_VAE.pth"
    torch.save(official_vae_state(vae), out / name)
    torch.save(official_umt5_state(UMT5EncoderModel.from_pretrained(diffusers_root / "text_encoder")),
               out / "models_t5_umt5-xxl-enc-bf16.pth")  # fmt: skip
    shutil.copytree(diffusers_root / "tokenizer", out / "google" / "umt5-xxl")
    return out


@pytest.fixture(scope="session")
def official_layout() -> SimpleNamespace:
    """The official-layout writers above (test files cannot import conftest by name)."""
    return SimpleNamespace(
        write_release=write_official_release, write_dit=write_official_dit, dit_config=official_dit_config,
        vae_blocks=official_vae_blocks, vae_state=official_vae_state, umt5_state=official_umt5_state,
    )  # fmt: skip


@pytest.fixture
def one_thread():
    """Distillation on one thread (:func:`wan22_train.distill_toy.one_thread`)."""
    from wan22_train.distill_toy import one_thread

    with one_thread():
        yield
