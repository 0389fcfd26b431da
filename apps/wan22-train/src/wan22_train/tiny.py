"""``wan22-train make-tiny``: a complete tiny Wan2.2 model set + clip dataset, built locally.

Layout (diffusers pipeline folder, what a user's real Wan2.2-T2V-A14B-Diffusers folder looks like):
``model_index.json``, ``transformer/`` (``WanTransformer3DModel``), ``vae/`` (``AutoencoderKLWan``),
``text_encoder/`` (``UMT5EncoderModel``), ``tokenizer/`` (a word-level tokenizer built with
``tokenizers``), and ``data/`` (mp4 clips of moving shapes + ``metadata.json``). Fixed seeds: the
same call writes the same weights.

With ``vae_fit_steps`` > 0 (the CLI's and the demo's default, :data:`VAE_FIT_STEPS`) the VAE is
fitted to the clips' frames (``mm_trainer.fit_autoencoder``) so that its decoder draws them: a
predictor trained on a random VAE's latents could only ever decode to noise. The tiny VAE is
frame-wise: every causal 3D convolution's taps on earlier frames are zero (and, fitted on single
frames, stay zero), so a clip encodes frame by frame and the motion is the predictor's to learn.
Its reconstruction PSNR on the clips goes to ``vae/fit.json`` and ``latents_mean`` / ``latents_std``
in its config are the clips' latent statistics. The fitted ``vae/`` is the cache: a later call
reuses it when its ``fit.json`` records the same seed, fit steps and clips (``metadata.json``'s
SHA-256), and refits otherwise.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from diffusers import AutoencoderKLWan, WanTransformer3DModel
from diffusers.models.autoencoders.autoencoder_kl_wan import WanCausalConv3d
from mm_checkpoint import write_pipeline_folder
from mm_data import VideoTextDataset, make_synthetic_dataset, psnr, write_caption_tokenizer
from mm_trainer import (
    fit_autoencoder,
    fit_report,
    latent_statistics,
    posterior_means,
    reconstruct,
    save_fitted,
)
from transformers import UMT5Config, UMT5EncoderModel

TEXT_DIM = 32
#: The tiny clips: frames, size and rate (what the shipped tiny configs train on).
CLIP = {"num_frames": 9, "height": 32, "width": 32, "fps": 8}
#: Fit steps of the tiny VAE for ``wan22-train make-tiny`` and the demo (0: a random VAE).
VAE_FIT_STEPS = 300
VAE_FIT_LR = 2e-3
VAE_FIT_BATCH = 8  # frames per fit step
#: The demo's clips (``wan22-train make-tiny`` and ``demo``): one large high-contrast shape in each
#: direction. (Four colours, one per direction, make the captions easier to tell apart for the
#: predictor but drop the 300-step VAE fit from ~26 to ~22 dB; see the issue 22 report.)
DEMO_SHAPES = (
    ("white", "circle", "up"), ("white", "circle", "right"), ("white", "circle", "down"), ("white", "circle", "left"),
)  # fmt: skip
#: A 2x2 patchify (as Wan2.2's own VAE), no further down-sampling, no temporal compression.
TINY_VAE = dict(
    base_dim=32, z_dim=16, dim_mult=[1], num_res_blocks=0, temperal_downsample=[], patch_size=2,
    in_channels=12, out_channels=12, scale_factor_temporal=1, scale_factor_spatial=2,
)  # fmt: skip


def write_tokenizer(out: Path):
    """A word-level tokenizer over the synthetic captions' words (``</s>`` appended, like T5)."""
    specials = {"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>"}
    return write_caption_tokenizer(out, special_tokens=specials, template="$A </s>", model_max_length=512)


def tiny_transformer(**overrides: Any) -> WanTransformer3DModel:
    """The tiny predictor; ``overrides`` replace its config keys (e.g. ``patch_size``, ``num_layers``)."""
    z = TINY_VAE["z_dim"]
    config = dict(
        patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=16, in_channels=z, out_channels=z,
        text_dim=TEXT_DIM, freq_dim=32, ffn_dim=128, num_layers=2, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024,
    )  # fmt: skip
    return WanTransformer3DModel(**(config | overrides))


def tiny_vae() -> AutoencoderKLWan:
    """:data:`TINY_VAE`, frame-wise: the causal convolutions' taps on earlier frames are zero."""
    z = TINY_VAE["z_dim"]
    vae = AutoencoderKLWan(**TINY_VAE, latents_mean=[0.0] * z, latents_std=[1.0] * z)
    with torch.no_grad():
        for module in vae.modules():
            if isinstance(module, WanCausalConv3d):
                module.weight[:, :, :-1] = 0
    return vae


def tiny_text_encoder(vocab_size: int) -> UMT5EncoderModel:
    config = UMT5Config(
        vocab_size=vocab_size, d_model=TEXT_DIM, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8,
    )  # fmt: skip
    return UMT5EncoderModel(config).eval()


def make_tiny(
    out: str | Path,
    *,
    seed: int = 0,
    num_clips: int = 8,
    vae_fit_steps: int = 0,
    shapes: Sequence[tuple[str, str, str]] | None = None,
    clip: Mapping[str, int] = CLIP,
) -> Path:
    """Write the tiny model set and dataset into ``out`` (skipping what is already complete); with
    ``vae_fit_steps`` > 0 the VAE is fitted to the clips (see the module docstring). ``shapes`` fixes
    the clips' ``(colour, shape, direction)`` (``mm_data.make_synthetic_dataset``; default: drawn
    from ``seed``); ``clip`` their ``num_frames``, ``height``, ``width`` and ``fps`` (default :data:`CLIP`)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    metadata = out / "data" / "metadata.json"
    if not metadata.is_file():
        size = ((clip["height"], clip["width"]),)
        make_synthetic_dataset(
            out / "data", num_clips=num_clips, sizes=size, fps=(clip["fps"],), num_frames=(clip["num_frames"],),
            seed=seed, shapes=shapes,
        )  # fmt: skip
    if vae_fit_steps > 0:
        write_fitted_vae(out / "vae", metadata, steps=vae_fit_steps, seed=seed, clip=clip)
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
    return out


def load_clips(metadata: str | Path, clip: Mapping[str, int] = CLIP) -> torch.Tensor:
    """The tiny clips (of size ``clip``) as one ``[N, 3, F, H, W]`` tensor in ``[-1, 1]`` (decoded, as
    training sees them)."""
    size = {k: clip[k] for k in ("num_frames", "height", "width")}
    dataset = VideoTextDataset(metadata, **size, frame_offset="start")
    return torch.stack([dataset[i]["video"] for i in range(len(dataset))])


def write_fitted_vae(
    folder: Path, metadata: Path, *, steps: int, seed: int, clip: Mapping[str, int] = CLIP
) -> dict[str, Any]:
    """Fit :func:`tiny_vae` to the clips' frames and save it with its report, unless ``folder`` holds
    a fit of the same seed, steps and clips already. Returns the report (``psnr_db`` of the clips'
    reconstruction, ``fit_steps``, ``fit_seconds``, ``samples``, ``seed``, ``clips_sha256``)."""
    key = {"seed": seed, "clips_sha256": hashlib.sha256(metadata.read_bytes()).hexdigest()}
    cached = fit_report(folder)
    if (
        cached is not None
        and cached.get("fit_steps") == steps
        and all(cached.get(k) == v for k, v in key.items())
    ):
        return cached
    torch.manual_seed(seed)
    vae, clips = tiny_vae(), load_clips(metadata, clip)
    frames = clips.transpose(1, 2).flatten(0, 1).unsqueeze(2)  # [N*F, 3, 1, H, W]: frame-wise
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # ops this small gain nothing from more; on a busy machine they lose a lot
    try:
        fit = fit_autoencoder(vae, frames, steps=steps, lr=VAE_FIT_LR, batch_size=VAE_FIT_BATCH, seed=seed)
    finally:
        torch.set_num_threads(threads)
    mean, std = latent_statistics(posterior_means(vae, clips))
    vae.register_to_config(latents_mean=mean, latents_std=std)
    report = fit.report(len(clips), psnr_db=psnr(reconstruct(vae, clips).clamp(-1, 1), clips))
    save_fitted(vae, folder, {**report, **key})
    return report | key


def fit_summary(out: str | Path) -> str:
    """One line on how well the tiny VAE of ``out`` reconstructs the clips (its ``vae/fit.json``)."""
    report = fit_report(Path(out) / "vae")
    if report is None:
        return f"tiny VAE: random weights (not fitted; {Path(out) / 'vae'} has no fit.json)"
    return (
        f"tiny VAE reconstruction PSNR on the {report['samples']} clips: {report['psnr_db']:.2f} dB "
        f"({report['fit_steps']} fit steps, {report['fit_seconds']} s)"
    )


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
