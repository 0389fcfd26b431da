"""``wan22-train make-tiny``: a complete tiny Wan2.2 model set + clip dataset, built locally.

Layout (diffusers pipeline folder, what a user's real Wan2.2-T2V-A14B-Diffusers folder looks like):
``model_index.json``, ``transformer/`` (``WanTransformer3DModel``), ``vae/`` (``AutoencoderKLWan``),
``text_encoder/`` (``UMT5EncoderModel``), ``tokenizer/`` (a word-level tokenizer built with
``tokenizers``), and ``data/`` (mp4 clips of moving shapes + ``metadata.json``). Fixed seeds: the
same call writes the same weights.
"""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import AutoencoderKLWan, WanTransformer3DModel
from mm_checkpoint import write_pipeline_folder
from mm_data import make_synthetic_dataset, write_caption_tokenizer
from transformers import UMT5Config, UMT5EncoderModel

TEXT_DIM = 32


def write_tokenizer(out: Path):
    """A word-level tokenizer over the synthetic captions' words (``</s>`` appended, like T5)."""
    specials = {"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>"}
    return write_caption_tokenizer(out, special_tokens=specials, template="$A </s>", model_max_length=512)


def tiny_transformer() -> WanTransformer3DModel:
    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=8, in_channels=4, out_channels=4,
        text_dim=TEXT_DIM, freq_dim=32, ffn_dim=64, num_layers=2, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024,
    )  # fmt: skip


def tiny_vae() -> AutoencoderKLWan:
    return AutoencoderKLWan(
        base_dim=8, z_dim=4, dim_mult=[1, 2], num_res_blocks=1, temperal_downsample=[True],
        latents_mean=[0.0] * 4, latents_std=[1.0] * 4, scale_factor_temporal=2, scale_factor_spatial=2,
    )  # fmt: skip


def tiny_text_encoder(vocab_size: int) -> UMT5EncoderModel:
    config = UMT5Config(
        vocab_size=vocab_size, d_model=TEXT_DIM, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8,
    )  # fmt: skip
    return UMT5EncoderModel(config).eval()


def make_tiny(out: str | Path, *, seed: int = 0, num_clips: int = 8) -> Path:
    """Write the tiny model set and dataset into ``out`` (skipping what is already complete)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    tokenizer = write_tokenizer(out / "tokenizer")
    components = {
        "transformer": ("diffusers", "WanTransformer3DModel", tiny_transformer),
        "vae": ("diffusers", "AutoencoderKLWan", tiny_vae),
        "text_encoder": ("transformers", "UMT5EncoderModel", lambda: tiny_text_encoder(len(tokenizer))),
    }
    write_pipeline_folder(
        out, "WanPipeline", components, diffusers_version="0.35.0",
        extra_index={"tokenizer": ["transformers", "PreTrainedTokenizerFast"]},
    )  # fmt: skip
    if not (out / "data" / "metadata.json").is_file():
        make_synthetic_dataset(
            out / "data", num_clips=num_clips, sizes=((32, 32),), fps=(8,), num_frames=(9,), seed=seed
        )
    return out


def tiny_overrides(out: str | Path) -> list[str]:
    """Config overrides pointing the shipped tiny configs' model and data paths at ``out``."""
    out = Path(out)
    return [
        f"model.models.ae.from_pretrained={out / 'vae'}",
        f"model.models.text_encoder.from_pretrained={out / 'text_encoder'}",
        f"model.models.text_encoder.config.tokenizer={out / 'tokenizer'}",
        f"model.models.predictor.from_pretrained={out / 'transformer'}",
        f"data.data_path={out / 'data' / 'metadata.json'}",
    ]


def tiny_cached_overrides(out: str | Path, cache: str | Path) -> list[str]:
    """Overrides pointing ``tiny_t2v_cached.yaml`` at the model set and clips in ``out`` and at ``cache``."""
    out, pre = Path(out), "data.dataset.preprocess"
    return [
        f"model.models.predictor.from_pretrained={out / 'transformer'}",
        f"data.data_path={cache}",
        f"{pre}.source={out / 'data' / 'metadata.json'}",
        f"{pre}.ae.from_pretrained={out / 'vae'}",
        f"{pre}.text_encoder.from_pretrained={out / 'text_encoder'}",
        f"{pre}.text_encoder.config.tokenizer={out / 'tokenizer'}",
    ]
