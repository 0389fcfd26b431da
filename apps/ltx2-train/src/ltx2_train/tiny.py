"""``ltx2-train make-tiny``: a complete tiny LTX-2 model set + clip dataset, built locally.

Layout (what a real ``Lightricks/LTX-2`` diffusers folder looks like, minus the vocoder):
``transformer/`` (``LTX2VideoTransformer3DModel``), ``vae/`` (``AutoencoderKLLTX2Video``),
``audio_vae/`` (``AutoencoderKLLTX2Audio``), ``text_encoder/`` (a 2-layer Gemma-3 text model),
``tokenizer/`` (a word-level tokenizer built with ``tokenizers``, left padding like Gemma),
``connectors/`` (``LTX2TextConnectors``) and ``data/`` (silent mp4 clips + ``metadata.json``, and
the clips' IC-LoRA references: :func:`write_ic_lora_references`).
Fixed seeds: the same call writes the same weights.

``release`` (:data:`RELEASE_OPTIONS`) picks the transformer's LTX-2 release: ``2.0`` (the default), ``2.3``
(gated attention, prompt-modulated cross-attention, no caption projection in the transformer) with 2.3's
connectors (``per_modality_projections``: the video and audio text embeddings come out at the
transformer's ``cross_attention_dim`` / ``audio_cross_attention_dim``), both with a Gemma-3 text encoder, or
``2.5`` (2.5's transformer options, the same connectors) with a Gemma-4 text encoder: a 2-layer
``Gemma4UnifiedTextModel``, the language model of 2.5's ``Gemma4UnifiedForConditionalGeneration``
(:func:`tiny_gemma4_text_encoder`; :data:`TEXT_ENCODERS`).

The clips are :data:`DEMO_SHAPES`: four circles, one colour per direction, 5 frames of 16 x 16
(:data:`CLIP`). With ``vae_fit_steps`` > 0 (the CLI's default, :data:`VAE_FIT_STEPS`) the video VAE
is fitted to them (``mm_trainer.fit_or_reuse_autoencoder``; whole clips, as the VAE compresses time
x2 too) so that its decoder draws them; the reconstruction PSNR goes to ``vae/fit.json`` and the
VAE's ``latents_mean`` / ``latents_std`` buffers become the clips' latent statistics, which
``preprocess`` normalises with (``(z - mean) * scaling_factor / std``). The fitted ``vae/`` is the
cache: a later call reuses it when its ``fit.json`` records the same seed, fit steps, fit settings
and decoded clips (their SHA-256). The clips are silent (preprocess gives them a synthetic tone), so
the audio VAE keeps its random weights: it is not fitted.

The transformer's patch covers the whole latent clip (:func:`one_token_transformer`): one video
token, 384 wide. A RoPE-only transformer (no absolute position) sampled from pure noise cannot tell
the first frame from the last with many tokens; with one, the motion lives in the token's features
and 200 steps of :data:`LEARN_TRAINING` learn the four clips (``benchmarks/ltx2_demo_learning.py``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from diffusers import AutoencoderKLLTX2Audio, AutoencoderKLLTX2Video, LTX2VideoTransformer3DModel
from diffusers.pipelines.ltx2 import LTX2Vocoder
from diffusers.pipelines.ltx2.connectors import LTX2TextConnectors
from mm_checkpoint import write_pipeline_folder
from mm_data import load_clip_tensors, make_synthetic_dataset, write_caption_tokenizer
from mm_trainer import fit_or_reuse_autoencoder
from transformers import Gemma3TextConfig, Gemma3TextModel
from transformers.models.gemma4_unified import Gemma4UnifiedTextConfig, Gemma4UnifiedTextModel

from ltx2_train.release_file import write_release_file
from ltx2_train.version import folder_version

TEXT_DIM = 32  # Gemma hidden size = caption channels
TEXT_LAYERS = 2  # -> 3 hidden states (embeddings + 2 layers) stacked for the connectors
MAX_TEXT_LEN = 16
#: The tiny clips: frames, size and rate (what the shipped tiny config trains on); latent grid 3 x 4 x 4.
CLIP = {"num_frames": 5, "height": 16, "width": 16, "fps": 8}
#: The tiny clips' (colour, shape, direction): one colour per direction.
DEMO_SHAPES = (
    ("red", "circle", "up"), ("blue", "circle", "down"), ("green", "circle", "left"), ("yellow", "circle", "right"),
)  # fmt: skip
#: The IC-LoRA source ``make-tiny`` writes beside ``metadata.json``: its rows with a ``reference`` column
#: (:func:`write_ic_lora_references`).
IC_LORA_METADATA = "metadata_ic_lora.json"
#: Fit of the tiny video VAE (whole clips, every clip in each step, plain MSE: with an L1 term the
#: fit settles on the background, ~18 dB, for hundreds of steps).
VAE_FIT_STEPS = 700
VAE_FIT = {"lr": 3e-3, "batch_size": 4, "l1_weight": 0.0}
AUDIO = {"sample_rate": 16000, "hop_length": 160, "mel_bins": 16}
#: Overrides of ``configs/tiny_t2av.yaml`` under which a run learns the four clips, so that a sample
#: for each training caption moves as captioned (the e2e test; ``benchmarks/ltx2_demo_learning.py``).
#: Each step trains every clip four times with its own noise and sigma: a micro-batch of 16 over the
#: 4-clip epoch, which ``data.drop_last=false`` fills by cycling, and every place in the global order
#: keys its own draws. Then 200 steps of warmup + cosine. With each clip once per step, what a run
#: learns depends on its noise draws: 2 to 4 of the 4 captions moved after 300-400 steps.
LEARN_TRAINING = (
    "training.micro_batch_size=16", "data.drop_last=false", "training.train_iters=200",
    "training.lr_scheduler=cosine", "training.lr_warmup_iters=20",
)  # fmt: skip

#: 2 blocks, 4 video heads x 8, 4 audio heads x 4; latent/caption sizes match the tiny VAEs and text side.
TINY_TRANSFORMER = dict(
    in_channels=8, out_channels=8, num_attention_heads=4, attention_head_dim=8, cross_attention_dim=32,
    audio_in_channels=16, audio_out_channels=16, audio_num_attention_heads=4, audio_attention_head_dim=4,
    audio_cross_attention_dim=16, num_layers=2, caption_channels=TEXT_DIM, vae_scale_factors=(2, 4, 4),
    base_height=64, base_width=64, audio_sampling_rate=AUDIO["sample_rate"], audio_hop_length=AUDIO["hop_length"],
)  # fmt: skip


#: Each release's transformer options (diffusers' ``LTX2VideoTransformer3DModel`` arguments) on top of a
#: shape: the options that tell the releases apart (:mod:`ltx2_train.version`) and the ones each release's
#: checkpoints set besides (the audio side's gates and prompt modulation, perturbed attention, 2.5's
#: keyframe embedding). Tiny stand-ins for tests and ``make-tiny``, not the released configs.
RELEASE_OPTIONS: dict[str, dict[str, Any]] = {
    "2.0": {},
    "2.3": dict(gated_attn=True, cross_attn_mod=True, audio_gated_attn=True, audio_cross_attn_mod=True,
                use_prompt_embeddings=False, perturbed_attn=True),
    "2.5": dict(gated_attn=True, cross_attn_mod=True, audio_gated_attn=True, audio_cross_attn_mod=True,
                use_prompt_embeddings=False, perturbed_attn=True, ff_bias=False, use_prompt_adaln_single=False,
                use_keyframes_abs_pos_embedding=True),
}  # fmt: skip
#: The releases ``make-tiny`` writes a whole model set for.
MAKE_TINY_RELEASES = ("2.0", "2.3", "2.5")


def write_tokenizer(out: Path):
    """A word-level tokenizer over the synthetic captions' words (``<bos>`` prepended, left padding)."""
    specials = {"pad_token": "<pad>", "eos_token": "<eos>", "bos_token": "<bos>", "unk_token": "<unk>"}
    return write_caption_tokenizer(
        out, special_tokens=specials, template="<bos> $A", model_max_length=MAX_TEXT_LEN, padding_side="left"
    )


def tiny_transformer(**overrides: Any) -> LTX2VideoTransformer3DModel:
    """:data:`TINY_TRANSFORMER` (patch size 1) with ``overrides`` (e.g. :func:`one_token_patch`)."""
    return LTX2VideoTransformer3DModel(**(TINY_TRANSFORMER | overrides))


def latent_grid(clip: Mapping[str, int] = CLIP) -> tuple[int, int, int]:
    """The tiny VAE's latent ``(frames, height, width)`` of a clip (x2 in time, x4 in space)."""
    t, s, _ = TINY_TRANSFORMER["vae_scale_factors"]
    return 1 + (clip["num_frames"] - 1) // t, clip["height"] // s, clip["width"] // s


def one_token_patch(clip: Mapping[str, int] = CLIP) -> dict[str, int]:
    """Config overrides of :data:`TINY_TRANSFORMER` whose patch covers the clip's whole latent grid (one
    video token) and whose width is the token's (``in_channels``): a narrower model cannot output the
    velocity's full-rank ``x_sigma / sigma`` part, and its samples keep noise outside its span."""
    frames, height, width = latent_grid(clip)
    if height != width:
        raise ValueError(f"one_token_patch: the latent grid {frames}x{height}x{width} is not square")
    channels = TINY_TRANSFORMER["in_channels"] * frames * height * width
    heads = TINY_TRANSFORMER["num_attention_heads"]
    return {
        "patch_size": height, "patch_size_t": frames, "in_channels": channels, "out_channels": channels,
        "attention_head_dim": channels // heads, "cross_attention_dim": channels,
    }  # fmt: skip


def one_token_transformer(
    clip: Mapping[str, int] = CLIP, release: str = "2.0"
) -> LTX2VideoTransformer3DModel:
    """The tiny transformer of :func:`one_token_patch` with ``release``'s options (:data:`RELEASE_OPTIONS`),
    its ``proj_in`` / ``proj_out`` starting as the identity: the velocity's ``x_sigma / sigma`` part is then
    there from the first step instead of a map that random projections take hundreds of steps to learn."""
    model = tiny_transformer(**one_token_patch(clip), **RELEASE_OPTIONS[release])
    with torch.no_grad():
        for proj in (model.proj_in, model.proj_out):
            proj.weight.copy_(torch.eye(*proj.weight.shape))
            proj.bias.zero_()
    return model


def tiny_vae() -> AutoencoderKLLTX2Video:
    """8 latent channels, 16 wide; x4 spatial (patch 2 x one down block), x2 temporal."""
    return AutoencoderKLLTX2Video(
        latent_channels=8, block_out_channels=(16, 16), decoder_block_out_channels=(16,),
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


def tiny_gemma4_text_encoder(vocab_size: int) -> Gemma4UnifiedTextModel:
    """LTX-2.5's text encoder at :data:`TEXT_DIM` x :data:`TEXT_LAYERS` (a sliding-window layer, then a full one:
    Gemma-4's last layer attends fully), the shape of :func:`tiny_text_encoder`."""
    config = Gemma4UnifiedTextConfig(
        vocab_size=vocab_size, hidden_size=TEXT_DIM, intermediate_size=64, num_hidden_layers=TEXT_LAYERS,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, global_head_dim=16, max_position_embeddings=64,
        sliding_window=16, layer_types=["sliding_attention", "full_attention"], pad_token_id=0, eos_token_id=1,
        bos_token_id=2,
    )  # fmt: skip
    return Gemma4UnifiedTextModel(config).eval()


#: Each release's tiny text encoder: (transformers class name, builder from the vocabulary size).
TEXT_ENCODERS: dict[str, tuple[str, Any]] = {
    "2.0": ("Gemma3TextModel", tiny_text_encoder),
    "2.3": ("Gemma3TextModel", tiny_text_encoder),
    "2.5": ("Gemma4UnifiedTextModel", tiny_gemma4_text_encoder),
}


def tiny_connectors() -> LTX2TextConnectors:
    """LTX-2.0's connectors: one projection of Gemma's stacked layers to ``TEXT_DIM`` for both streams (the
    transformer's caption projections take it from there)."""
    return LTX2TextConnectors(
        caption_channels=TEXT_DIM, text_proj_in_factor=TEXT_LAYERS + 1,
        video_connector_num_attention_heads=2, video_connector_attention_head_dim=16,
        video_connector_num_layers=1, video_connector_num_learnable_registers=8,
        audio_connector_num_attention_heads=2, audio_connector_attention_head_dim=16,
        audio_connector_num_layers=1, audio_connector_num_learnable_registers=8, connector_rope_base_seq_len=64,
    )  # fmt: skip


def tiny_release_connectors(video_dim: int, audio_dim: int) -> LTX2TextConnectors:
    """LTX-2.3's and 2.5's connectors (``per_modality_projections``, gated attention): the video and audio text
    embeddings at ``video_dim`` / ``audio_dim`` wide, the widths of a transformer without caption projections
    (its ``cross_attention_dim`` / ``audio_cross_attention_dim``); two heads each."""
    return LTX2TextConnectors(
        caption_channels=TEXT_DIM, text_proj_in_factor=TEXT_LAYERS + 1, per_modality_projections=True,
        video_hidden_dim=video_dim, audio_hidden_dim=audio_dim, video_gated_attn=True, audio_gated_attn=True,
        video_connector_num_attention_heads=2, video_connector_attention_head_dim=video_dim // 2,
        video_connector_num_layers=1, video_connector_num_learnable_registers=8,
        audio_connector_num_attention_heads=2, audio_connector_attention_head_dim=audio_dim // 2,
        audio_connector_num_layers=1, audio_connector_num_learnable_registers=8, connector_rope_base_seq_len=64,
    )  # fmt: skip


RELEASE_FILE = "ltx-2-tiny.safetensors"
"""The official release file ``make-tiny --single-file`` writes into the model set's folder."""


def tiny_vocoder() -> LTX2Vocoder:
    """A two-stage vocoder over the tiny audio VAE's stereo log-mel (2 x 16 mel bins); untrained."""
    return LTX2Vocoder(
        in_channels=2 * AUDIO["mel_bins"], hidden_channels=16, out_channels=2, upsample_kernel_sizes=[4, 4],
        upsample_factors=[2, 2], resnet_kernel_sizes=[3], resnet_dilations=[[1]],
        output_sampling_rate=AUDIO["sample_rate"],
    )  # fmt: skip


def write_tiny_release_file(root: str | Path, *, seed: int = 0) -> Path:
    """The LTX-2.0 model set ``root`` (:func:`make_tiny`'s) with :func:`tiny_vocoder` as one official release
    file ``root/ltx-2-tiny.safetensors`` (:func:`ltx2_train.release_file.write_release_file`)."""
    torch.manual_seed(seed)
    return write_release_file(root, Path(root) / RELEASE_FILE, vocoder=tiny_vocoder())


def make_tiny(
    out: str | Path,
    *,
    seed: int = 0,
    vae_fit_steps: int = VAE_FIT_STEPS,
    shapes: Sequence[tuple[str, str, str]] = DEMO_SHAPES,
    release: str = "2.0",
) -> Path:
    """Write the tiny model set of LTX-2 ``release`` and the clips of ``shapes`` into ``out`` (skipping what
    is already complete; a transformer of another release there is refused); with ``vae_fit_steps`` > 0 the
    video VAE is fitted to the clips (module docstring)."""
    out = Path(out)
    check_release(out, release)
    out.mkdir(parents=True, exist_ok=True)
    metadata = out / "data" / "metadata.json"
    if not metadata.is_file():
        make_synthetic_dataset(
            out / "data", num_clips=len(shapes), sizes=((CLIP["height"], CLIP["width"]),), fps=(CLIP["fps"],),
            num_frames=(CLIP["num_frames"],), seed=seed, shapes=shapes,
        )  # fmt: skip
    if not (out / "data" / IC_LORA_METADATA).is_file():
        write_ic_lora_references(out / "data", shapes, seed=seed)
    if vae_fit_steps > 0:
        write_fitted_vae(out / "vae", metadata, steps=vae_fit_steps, seed=seed)
    torch.manual_seed(seed)
    tokenizer = write_tokenizer(out / "tokenizer")
    shape = TINY_TRANSFORMER | one_token_patch()
    connectors = tiny_connectors if release == "2.0" else (
        lambda: tiny_release_connectors(shape["cross_attention_dim"], shape["audio_cross_attention_dim"])
    )  # fmt: skip
    encoder_class, build_encoder = TEXT_ENCODERS[release]
    components = {
        "transformer": (
            "diffusers",
            "LTX2VideoTransformer3DModel",
            lambda: one_token_transformer(release=release),
        ),
        "vae": ("diffusers", "AutoencoderKLLTX2Video", tiny_vae),
        "audio_vae": ("diffusers", "AutoencoderKLLTX2Audio", tiny_audio_vae),
        "text_encoder": ("transformers", encoder_class, lambda: build_encoder(len(tokenizer))),
        "connectors": ("ltx2", "LTX2TextConnectors", connectors),
    }
    write_pipeline_folder(
        out, "LTX2Pipeline", components, diffusers_version="0.42.1",
        extra_index={"tokenizer": ["transformers", "PreTrainedTokenizerFast"]},
    )  # fmt: skip
    return out


def write_ic_lora_references(data: Path, shapes: Sequence[tuple[str, str, str]], *, seed: int = 0) -> Path:
    """IC-LoRA references of the demo clips in ``data`` (their ``metadata.json``): for each, the same shape
    and colour moving the opposite way (``references/``), named in the ``reference`` column of
    :data:`IC_LORA_METADATA`, whose rows are ``metadata.json``'s (the clip is the target: its reference with
    the motion reversed). Returns that metadata file."""
    opposite = {"up": "down", "down": "up", "left": "right", "right": "left"}
    reversed_shapes = [(colour, shape, opposite[direction]) for colour, shape, direction in shapes]
    make_synthetic_dataset(
        data / "references", num_clips=len(shapes), sizes=((CLIP["height"], CLIP["width"]),),
        fps=(CLIP["fps"],), num_frames=(CLIP["num_frames"],), seed=seed, shapes=reversed_shapes,
    )  # fmt: skip
    rows = json.loads((data / "metadata.json").read_text())
    references = json.loads((data / "references" / "metadata.json").read_text())
    for row, reference in zip(rows, references, strict=True):
        row["reference"] = f"references/{reference['path']}"
    path = data / IC_LORA_METADATA
    path.write_text(json.dumps(rows, indent=1))
    return path


def check_release(out: Path, release: str) -> None:
    """Refuse a ``release`` :func:`make_tiny` does not build, or an ``out`` whose transformer is another's."""
    if release not in MAKE_TINY_RELEASES:
        raise ValueError(f"make-tiny --release {release}: expected one of {list(MAKE_TINY_RELEASES)}")
    if (out / "transformer" / "config.json").is_file():
        found = folder_version(out / "transformer")
        if found != release:
            raise ValueError(
                f"{out / 'transformer'}: an LTX-{found} transformer is already there, not {release}; "
                "write the tiny set of another release into another folder"
            )


def load_clips(metadata: str | Path) -> torch.Tensor:
    """The tiny clips as one ``[N, 3, F, H, W]`` tensor in ``[-1, 1]`` (decoded, as preprocess reads them)."""
    return load_clip_tensors(metadata, **{k: CLIP[k] for k in ("num_frames", "height", "width")})


def write_fitted_vae(folder: Path, metadata: Path, *, steps: int, seed: int) -> dict[str, Any]:
    """Fit :func:`tiny_vae` to the clips of ``metadata`` (or reuse the fit in ``folder``); its report."""

    def set_statistics(vae: AutoencoderKLLTX2Video, mean: list[float], std: list[float]) -> None:
        vae.latents_mean.copy_(torch.tensor(mean))  # buffers (saved with the weights), not config
        vae.latents_std.copy_(torch.tensor(std))

    return fit_or_reuse_autoencoder(
        tiny_vae, folder, load_clips(metadata), steps=steps, seed=seed, set_statistics=set_statistics,
        **VAE_FIT,
    )  # fmt: skip
