"""``wan22-train make-tiny``: a complete tiny Wan2.2 model set + clip dataset, built locally.

Layout (diffusers pipeline folder, what a user's real Wan2.2-T2V-A14B-Diffusers folder looks like, and
what diffusers' ``WanPipeline.from_pretrained`` loads): ``model_index.json``, ``transformer/``
(``WanTransformer3DModel``), ``vae/`` (``AutoencoderKLWan``), ``text_encoder/`` (``UMT5EncoderModel``),
``tokenizer/`` (a word-level tokenizer built with ``tokenizers``), ``scheduler/`` (the released
folders' ``UniPCMultistepScheduler`` on flow sigmas, at the tiny configs' time shift), and ``data/``
(mp4 clips of moving shapes + ``metadata.json``). One expert: ``transformer_2`` is null, as in the
TI2V-5B release. Fixed seeds: the same call writes the same weights.

With ``vae_fit_steps`` > 0 (the CLI's and the demo's default, :data:`VAE_FIT_STEPS`) the VAE is
fitted to the clips' frames (``mm_trainer.fit_autoencoder``) so that its decoder draws them: a
predictor trained on a random VAE's latents could only ever decode to noise. The tiny VAE is
frame-wise: every causal 3D convolution's taps on earlier frames are zero (and, fitted on single
frames, stay zero), so a clip encodes frame by frame and the motion is the predictor's to learn.
Its reconstruction PSNR on the clips goes to ``vae/fit.json`` and ``latents_mean`` / ``latents_std``
in its config are the clips' latent statistics. The fitted ``vae/`` is the cache: a later call
reuses it when its ``fit.json`` records the same seed, fit steps, fit settings and decoded clips
(their SHA-256), and refits otherwise.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanTransformer3DModel
from diffusers.models.autoencoders.autoencoder_kl_wan import WanCausalConv3d
from mm_checkpoint import write_pipeline_folder
from mm_data import load_clip_tensors, make_synthetic_dataset, write_caption_tokenizer
from mm_trainer import fit_or_reuse_autoencoder
from transformers import UMT5Config, UMT5EncoderModel

TEXT_DIM = 32
#: Time shift of the tiny set's scheduler: the tiny configs' training shift (``Wan22Pipeline``'s default).
TINY_FLOW_SHIFT = 3.0
#: The tiny clips: frames, size and rate (what the shipped tiny configs train on).
CLIP = {"num_frames": 9, "height": 32, "width": 32, "fps": 8}
#: Fit steps of the tiny VAE for ``wan22-train make-tiny`` and the demo (0: a random VAE): ~33 dB on
#: the demo's 16x16 clips in ~35 s, ~29 dB on 32x32 ones in ~75 s (2 cores).
VAE_FIT_STEPS = 600
VAE_FIT_LR = 2e-3
VAE_FIT_BATCH = 4  # frames per fit step
#: The demo's clips: one circle per direction, each its own colour, so that every caption names one
#: clip (``wan22-train make-tiny`` and ``demo``).
DEMO_SHAPES = (
    ("red", "circle", "up"), ("blue", "circle", "down"), ("green", "circle", "left"), ("yellow", "circle", "right"),
)  # fmt: skip
#: The fitted tiny VAE (``vae_fit_steps`` > 0): a 2x2 patchify (as Wan2.2's own VAE), no further
#: down-sampling, no temporal compression, 16 latent channels.
FRAME_VAE = dict(
    base_dim=32, z_dim=16, dim_mult=[1], num_res_blocks=0, temperal_downsample=[], patch_size=2,
    in_channels=12, out_channels=12, scale_factor_temporal=1, scale_factor_spatial=2,
)  # fmt: skip
#: The random tiny VAE of the plumbing tests (``vae_fit_steps=0``): 4 latent channels, x2 in time and space.
TINY_VAE = dict(
    base_dim=8, z_dim=4, dim_mult=[1, 2], num_res_blocks=1, temperal_downsample=[True],
    scale_factor_temporal=2, scale_factor_spatial=2,
)  # fmt: skip
#: The tiny predictor: 2 blocks of 4 heads x 8, a 1x2x2 patch (as Wan2.2's own), on :data:`TINY_VAE`'s
#: latents (a fitted set overrides the channels to :data:`FRAME_VAE`'s).
TINY_TRANSFORMER = dict(
    patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=8, in_channels=TINY_VAE["z_dim"],
    out_channels=TINY_VAE["z_dim"], text_dim=TEXT_DIM, freq_dim=32, ffn_dim=64, num_layers=2, cross_attn_norm=True,
    qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024,
)  # fmt: skip


def write_tokenizer(out: Path):
    """A word-level tokenizer over the synthetic captions' words (``</s>`` appended, like T5)."""
    specials = {"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>"}
    return write_caption_tokenizer(out, special_tokens=specials, template="$A </s>", model_max_length=512)


def tiny_transformer(**overrides: Any) -> WanTransformer3DModel:
    """The tiny predictor (:data:`TINY_TRANSFORMER`); ``overrides`` replace its config keys (e.g.
    ``patch_size``, ``num_layers``)."""
    return WanTransformer3DModel(**(TINY_TRANSFORMER | overrides))


def tiny_vae() -> AutoencoderKLWan:
    """:data:`TINY_VAE`, random: what the plumbing tests train on."""
    z = TINY_VAE["z_dim"]
    return AutoencoderKLWan(**TINY_VAE, latents_mean=[0.0] * z, latents_std=[1.0] * z)


def frame_vae() -> AutoencoderKLWan:
    """:data:`FRAME_VAE`, frame-wise: the causal convolutions' taps on earlier frames are zero."""
    z = FRAME_VAE["z_dim"]
    vae = AutoencoderKLWan(**FRAME_VAE, latents_mean=[0.0] * z, latents_std=[1.0] * z)
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


def tiny_scheduler() -> UniPCMultistepScheduler:
    """The sampling scheduler of the released Wan2.2 folders (UniPC on flow-matching sigmas), at
    :data:`TINY_FLOW_SHIFT`."""
    return UniPCMultistepScheduler(
        prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=TINY_FLOW_SHIFT
    )


def make_tiny(
    out: str | Path,
    *,
    seed: int = 0,
    num_clips: int = 8,
    vae_fit_steps: int = 0,
    shapes: Sequence[tuple[str, str, str]] | None = None,
    clip: Mapping[str, int] = CLIP,
    transformer: Mapping[str, Any] | None = None,
) -> Path:
    """Write the tiny model set and dataset into ``out`` (skipping what is already complete); with
    ``vae_fit_steps`` > 0 the VAE is fitted to the clips (see the module docstring). ``shapes`` fixes
    the clips' ``(colour, shape, direction)`` (``mm_data.make_synthetic_dataset``; default: drawn
    from ``seed``); ``clip`` their ``num_frames``, ``height``, ``width`` and ``fps`` (default :data:`CLIP`);
    ``transformer`` overrides the tiny predictor's config (:func:`tiny_transformer`).

    A folder written before with other clip sizes or another predictor config is refused (ValueError
    naming the file), not silently reused."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    metadata = out / "data" / "metadata.json"
    fitted = vae_fit_steps > 0
    channels = {"in_channels": FRAME_VAE["z_dim"], "out_channels": FRAME_VAE["z_dim"]} if fitted else {}
    transformer = channels | dict(transformer or {})
    _refuse_other_model_set(out, clip, transformer)
    if not metadata.is_file():
        size = ((clip["height"], clip["width"]),)
        make_synthetic_dataset(
            out / "data", num_clips=num_clips, sizes=size, fps=(clip["fps"],), num_frames=(clip["num_frames"],),
            seed=seed, shapes=shapes,
        )  # fmt: skip
    if fitted:
        write_fitted_vae(out / "vae", metadata, steps=vae_fit_steps, seed=seed, clip=clip)
    torch.manual_seed(seed)
    tokenizer = write_tokenizer(out / "tokenizer")
    components = {
        "transformer": ("diffusers", "WanTransformer3DModel", lambda: tiny_transformer(**transformer)),
        "vae": ("diffusers", "AutoencoderKLWan", tiny_vae),
        "text_encoder": ("transformers", "UMT5EncoderModel", lambda: tiny_text_encoder(len(tokenizer))),
        "scheduler": ("diffusers", "UniPCMultistepScheduler", tiny_scheduler),
    }
    write_pipeline_folder(
        out, "WanPipeline", components, diffusers_version="0.35.0",
        extra_index={"tokenizer": ["transformers", "PreTrainedTokenizerFast"], "transformer_2": [None, None]},
    )  # fmt: skip
    return out


def whole_clip_patch(clip: Mapping[str, int]) -> tuple[int, int, int]:
    """The predictor patch that covers the fitted tiny VAE's whole latent of a ``clip``: one token per
    clip."""
    spatial, temporal = FRAME_VAE["scale_factor_spatial"], FRAME_VAE["scale_factor_temporal"]
    return (clip["num_frames"] // temporal, clip["height"] // spatial, clip["width"] // spatial)


def _refuse_other_model_set(out: Path, clip: Mapping[str, int], transformer: Mapping[str, Any]) -> None:
    """Raise when ``out`` holds clips of another size or a predictor of another config than asked for."""
    metadata = out / "data" / "metadata.json"
    if metadata.is_file():
        for row in json.loads(metadata.read_text()):
            found = (row["num_frames"], row["resolution"]["height"], row["resolution"]["width"])
            if row.get("kind", "clip") == "clip" and found != (
                clip["num_frames"],
                clip["height"],
                clip["width"],
            ):
                raise ValueError(
                    f"{metadata}: {row['path']} has {found[0]} frames of {found[1]}x{found[2]}, expected "
                    f"{clip['num_frames']} of {clip['height']}x{clip['width']}: this folder holds another tiny "
                    "set; use another folder or delete it"
                )
    config = out / "transformer" / "config.json"
    if config.is_file():
        written = json.loads(config.read_text())
        expected = TINY_TRANSFORMER | dict(transformer)
        wrong = {
            k: (written.get(k), _as_json(v)) for k, v in expected.items() if _as_json(v) != written.get(k)
        }
        if wrong:
            raise ValueError(
                f"{config}: written with {', '.join(f'{k}={w!r} (expected {v!r})' for k, (w, v) in wrong.items())}: "
                "this folder holds another tiny set; use another folder or delete it"
            )


def _as_json(value: Any) -> Any:
    return json.loads(json.dumps(value))


def load_clips(metadata: str | Path, clip: Mapping[str, int] = CLIP) -> torch.Tensor:
    """The tiny clips (of size ``clip``) as one ``[N, 3, F, H, W]`` tensor in ``[-1, 1]`` (decoded, as
    training sees them)."""
    return load_clip_tensors(metadata, **{k: clip[k] for k in ("num_frames", "height", "width")})


def write_fitted_vae(
    folder: Path, metadata: Path, *, steps: int, seed: int, clip: Mapping[str, int] = CLIP
) -> dict[str, Any]:
    """Fit :func:`frame_vae` to the clips' frames and save it with its report, unless ``folder`` holds
    a fit of the same seed, steps and clips already (``mm_trainer.fit_or_reuse_autoencoder``). Returns
    the report (``psnr_db`` of the clips' reconstruction, ``fit_steps``, ``fit_seconds``, ``samples``,
    ``seed``, ``fit``, ``samples_sha256``)."""
    clips = load_clips(metadata, clip)
    frames = clips.transpose(1, 2).flatten(0, 1).unsqueeze(2)  # [N*F, 3, 1, H, W]: frame-wise

    def set_statistics(vae: AutoencoderKLWan, mean: list[float], std: list[float]) -> None:
        vae.register_to_config(latents_mean=mean, latents_std=std)

    return fit_or_reuse_autoencoder(
        frame_vae, folder, clips, steps=steps, seed=seed, set_statistics=set_statistics,
        fit_samples=frames, lr=VAE_FIT_LR, batch_size=VAE_FIT_BATCH,
    )  # fmt: skip


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
