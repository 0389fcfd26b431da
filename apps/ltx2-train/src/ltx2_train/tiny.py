"""``ltx2-train make-tiny``: a complete tiny LTX-2 model set + clip dataset, built locally.

Layout (what a real ``Lightricks/LTX-2`` diffusers folder looks like, minus the vocoder):
``transformer/`` (``LTX2VideoTransformer3DModel``), ``vae/`` (``AutoencoderKLLTX2Video``),
``audio_vae/`` (``AutoencoderKLLTX2Audio``), ``text_encoder/`` (a 2-layer Gemma-3 text model),
``tokenizer/`` (a word-level tokenizer built with ``tokenizers``, left padding like Gemma),
``connectors/`` (``LTX2TextConnectors``) and ``data/`` (silent mp4 clips + ``metadata.json``).
Fixed seeds: the same call writes the same weights.
"""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import AutoencoderKLLTX2Audio, AutoencoderKLLTX2Video, LTX2VideoTransformer3DModel
from diffusers.pipelines.ltx2.connectors import LTX2TextConnectors
from mm_checkpoint import write_pipeline_folder
from mm_data import make_synthetic_dataset, write_caption_tokenizer
from transformers import Gemma3TextConfig, Gemma3TextModel

TEXT_DIM = 32  # Gemma hidden size = caption channels
TEXT_LAYERS = 2  # -> 3 hidden states (embeddings + 2 layers) stacked for the connectors
MAX_TEXT_LEN = 16
CLIP = {"num_frames": 9, "height": 32, "width": 32, "fps": 8}
AUDIO = {"sample_rate": 16000, "hop_length": 160, "mel_bins": 16}

#: 2 blocks, 4 video heads x 8, 4 audio heads x 4; latent/caption sizes match the tiny VAEs and text side.
TINY_TRANSFORMER = dict(
    in_channels=8, out_channels=8, num_attention_heads=4, attention_head_dim=8, cross_attention_dim=32,
    audio_in_channels=16, audio_out_channels=16, audio_num_attention_heads=4, audio_attention_head_dim=4,
    audio_cross_attention_dim=16, num_layers=2, caption_channels=TEXT_DIM, vae_scale_factors=(2, 4, 4),
    base_height=64, base_width=64, audio_sampling_rate=AUDIO["sample_rate"], audio_hop_length=AUDIO["hop_length"],
)  # fmt: skip


def write_tokenizer(out: Path):
    """A word-level tokenizer over the synthetic captions' words (``<bos>`` prepended, left padding)."""
    specials = {"pad_token": "<pad>", "eos_token": "<eos>", "bos_token": "<bos>", "unk_token": "<unk>"}
    return write_caption_tokenizer(
        out, special_tokens=specials, template="<bos> $A", model_max_length=MAX_TEXT_LEN, padding_side="left"
    )


def tiny_transformer() -> LTX2VideoTransformer3DModel:
    return LTX2VideoTransformer3DModel(**TINY_TRANSFORMER)


def tiny_vae() -> AutoencoderKLLTX2Video:
    """8 latent channels; x4 spatial (patch 2 x one down block), x2 temporal."""
    return AutoencoderKLLTX2Video(
        latent_channels=8, block_out_channels=(8, 8), decoder_block_out_channels=(8,),
        down_block_types=("LTX2VideoDownBlock3D", "LTX2VideoDownBlock3D"), layers_per_block=(1, 1, 1),
        decoder_layers_per_block=(1, 1), spatio_temporal_scaling=(True, False),
        decoder_spatio_temporal_scaling=(True,), decoder_inject_noise=(False, False),
        downsample_type=("spatiotemporal", "spatial"), upsample_type=("spatiotemporal",),
        upsample_residual=(True,), upsample_factor=(2,), patch_size=2, patch_size_t=1,
    )  # fmt: skip


def tiny_audio_vae() -> AutoencoderKLLTX2Audio:
    """4 latent channels x (16 mel bins / 4) = 16 packed audio channels; x4 in time."""
    return AutoencoderKLLTX2Audio(
        base_channels=16, output_channels=2, ch_mult=(1, 2, 4), num_res_blocks=1, in_channels=2,
        latent_channels=4, mel_bins=AUDIO["mel_bins"], resolution=16, sample_rate=AUDIO["sample_rate"],
        mel_hop_length=AUDIO["hop_length"],
    )  # fmt: skip


def tiny_text_encoder(vocab_size: int) -> Gemma3TextModel:
    config = Gemma3TextConfig(
        vocab_size=vocab_size, hidden_size=TEXT_DIM, intermediate_size=64, num_hidden_layers=TEXT_LAYERS,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64, sliding_window=16,
        pad_token_id=0, eos_token_id=1, bos_token_id=2,
    )  # fmt: skip
    return Gemma3TextModel(config).eval()


def tiny_connectors() -> LTX2TextConnectors:
    return LTX2TextConnectors(
        caption_channels=TEXT_DIM, text_proj_in_factor=TEXT_LAYERS + 1,
        video_connector_num_attention_heads=2, video_connector_attention_head_dim=16,
        video_connector_num_layers=1, video_connector_num_learnable_registers=8,
        audio_connector_num_attention_heads=2, audio_connector_attention_head_dim=16,
        audio_connector_num_layers=1, audio_connector_num_learnable_registers=8, connector_rope_base_seq_len=64,
    )  # fmt: skip


def make_tiny(out: str | Path, *, seed: int = 0, num_clips: int = 8) -> Path:
    """Write the tiny model set and dataset into ``out`` (skipping what is already complete)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    tokenizer = write_tokenizer(out / "tokenizer")
    components = {
        "transformer": ("diffusers", "LTX2VideoTransformer3DModel", tiny_transformer),
        "vae": ("diffusers", "AutoencoderKLLTX2Video", tiny_vae),
        "audio_vae": ("diffusers", "AutoencoderKLLTX2Audio", tiny_audio_vae),
        "text_encoder": ("transformers", "Gemma3TextModel", lambda: tiny_text_encoder(len(tokenizer))),
        "connectors": ("ltx2", "LTX2TextConnectors", tiny_connectors),
    }
    write_pipeline_folder(
        out, "LTX2Pipeline", components, diffusers_version="0.42.1",
        extra_index={"tokenizer": ["transformers", "PreTrainedTokenizerFast"]},
    )  # fmt: skip
    if not (out / "data" / "metadata.json").is_file():
        make_synthetic_dataset(
            out / "data", num_clips=num_clips, sizes=((CLIP["height"], CLIP["width"]),), fps=(CLIP["fps"],),
            num_frames=(CLIP["num_frames"],), seed=seed,
        )  # fmt: skip
    return out
