"""``ltx2-train preprocess``: clips -> per-sample safetensors of everything the transformer consumes.

Runs the frozen encoders once, before training, so that nothing of them is resident while the
transformer trains: the video VAE (``AutoencoderKLLTX2Video``), the audio VAE
(``AutoencoderKLLTX2Audio``, on a log-mel of the clip's audio), the text encoder (Gemma-3; LTX-2.5's: Gemma-4,
loaded with ``AutoModel``, every hidden state stacked as diffusers' ``LTX2Pipeline.encode_prompt`` does) and the
text connectors (``LTX2TextConnectors``). The model set's parts must be one release's (its text side, the
transformer beside it, the VAE's compression and the clip size: :mod:`ltx2_train.model_set`), checked before
any encoder loads. Each sample file holds ``latents [C, F, H, W]`` and ``audio_latents
[C, L, M]`` (both normalized with the VAEs' statistics, as upstream's pipeline does before
packing), ``prompt_embeds`` / ``audio_prompt_embeds [S, D]`` (connector outputs for the video and
audio streams), ``prompt_attention_mask [S]`` and ``frame_rate`` (for the RoPE time axis).

A video-only source (``audio: false``) may list images beside the clips: each is encoded as a one-frame
clip (``latents [C, 1, H, W]``, the video VAE's frame rule 8k+1 at k = 0, as upstream's image-to-video
pipeline encodes its image) at :data:`IMAGE_FRAME_RATE` unless ``fps`` is set; the cached dataset buckets
samples by their ``latents`` shape, so images and clips never share a micro-batch. With audio, images are
refused before any encoder loads (:func:`refuse_images`).

A source whose metadata rows name a ``reference`` clip (IC-LoRA) also caches ``reference_latents`` and,
with audio, ``reference_audio_latents`` per sample (:mod:`ltx2_train.references`: checked before any encoder
loads, keyed by the reference's content).

The cache is :func:`mm_data.cache_dataset`'s (through :func:`mm_trainer.write_latent_cache`): sharded,
keyed by each clip's content, the row (and, for a row whose prompt is drawn from a caption list, its
position), the reading parameters and the encoders' identity, so a re-run encodes only what changed and
resumes an interrupted run; it records the ``data.dataset.preprocess`` keys it was made with, which a
training run's own section must match (``mm_trainer.check_cache_made_as_configured``). Under ``torchrun`` the ranks split the clips; Gemma-3 is sharded over them
with FSDP2 when ``run.text_encoder_fsdp`` says so (docs/DESIGN.md "Latent cache").

A clip without an audio track in a source with audio (every clip's header is read first) is refused
before any encoder loads (``missing_audio: refuse``, :class:`MissingAudioError`), or encoded with silence
(``silence``: a zero waveform) or a stand-in tone chosen by the clip's content, its digest, not its row
(``tone``); the report names those clips (:func:`missing_audio_note`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from diffusers import AutoencoderKLLTX2Audio, AutoencoderKLLTX2Video
from diffusers.pipelines.ltx2.connectors import LTX2TextConnectors
from diffusers.pipelines.ltx2.pipeline_ltx2 import LTX2Pipeline as Upstream
from mm_config import DataConfig, TrainConfig
from mm_data import CacheReport, VideoTextDataset, is_image, probe_video
from mm_parallel import parse_dtype
from mm_trainer import (
    SampleFramesError,
    enable_vae_tiling,
    preprocess_ranks,
    preprocess_recipe,
    preprocess_section,
    shard_frozen,
    use_text_encoder_fsdp,
    weights_identity,
    write_latent_cache,
)

from ltx2_train.audio import (
    MissingAudioError,
    clip_waveform,
    has_audio_track,
    log_mel,
)
from ltx2_train.config_schema import MissingAudio, PreprocessOptions
from ltx2_train.model_set import check_preprocess_model_set
from ltx2_train.references import check_references, encode_reference, key_references, reference_paths
from ltx2_train.release_file import load_release_encoders

ENCODE_VERSION = 2
"""Bumped when what this module caches per sample changes (it is part of every sample's key). 2: a clip
whose row names no ``fps`` (a caption folder's rows name none) gets its header's frame rate, not 24."""
IMAGE_FRAME_RATE = 24.0
"""The frame rate cached with an image when neither ``data.dataset.preprocess.fps`` nor its row's ``fps`` is
set (LTX-2's default rate, the pipeline's ``frame_rate`` default). Only RoPE's time axis reads it: an
image's one latent frame spans ``[0, 1 / rate)`` seconds there, where the first frame of a clip at that
rate sits."""
GEMMA_BLOCKS = "*layers.{*}"
"""The FSDP units of a sharded Gemma-3 (its decoder layers, plus the root)."""


@dataclass
class LTX2Encoders:
    """The frozen LTX-2 encoders, in eval mode on one device."""

    vae: AutoencoderKLLTX2Video
    audio_vae: AutoencoderKLLTX2Audio | None
    text_encoder: torch.nn.Module | None
    """Gemma-3 (None once released: :meth:`release_text_side`)."""
    tokenizer: Any
    connectors: LTX2TextConnectors | None
    device: torch.device
    dtype: torch.dtype
    n_fft: int = 1024
    """STFT size of the log-mel front end: LTX-2's audio encoder uses 1024 (the diffusers config omits it)."""
    sharded: bool = False
    """Gemma-3 is FSDP-sharded over the ranks (every rank must call it equally often)."""

    @classmethod
    def load(
        cls,
        model_root: str | Path,
        *,
        audio: bool,
        device: torch.device,
        dtype: torch.dtype,
        shard_text_encoder: bool = False,
        release_file: str | Path | None = None,
    ) -> LTX2Encoders:
        """Load ``vae/``, ``audio_vae/`` (when ``audio``), ``text_encoder/``, ``tokenizer/``, ``connectors/``,
        in ``dtype``; Gemma-3 sharded over the ranks with ``shard_text_encoder``. With ``release_file`` (an
        official release ``.safetensors``) the VAEs' and connectors' weights come from it, their configs
        from the folders (:func:`ltx2_train.release_file.load_release_encoders`)."""
        from transformers import AutoModel, AutoTokenizer

        root = Path(model_root)
        missing = [d for d in ("vae", "text_encoder", "tokenizer", "connectors", *(["audio_vae"] if audio else []))
                   if not (root / d).is_dir()]  # fmt: skip
        if missing:
            raise FileNotFoundError(f"data.dataset.preprocess.model_root={root}: missing {missing}")
        tokenizer = AutoTokenizer.from_pretrained(root / "tokenizer")
        tokenizer.padding_side = "left"  # Gemma: left padding, as upstream's pipeline
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token

        def ready(module: torch.nn.Module) -> Any:
            return module.to(device=device).eval().requires_grad_(False)

        def diffusers_part(cls_: Any, name: str) -> Any:
            return ready(cls_.from_pretrained(root / name, torch_dtype=dtype))

        if release_file is not None:
            parts = load_release_encoders(release_file, root, audio=audio, dtype=dtype)
            vae, audio_vae, connectors = (None if m is None else ready(m) for m in parts)
        else:
            vae, connectors = (
                diffusers_part(AutoencoderKLLTX2Video, "vae"),
                diffusers_part(LTX2TextConnectors, "connectors"),
            )
            audio_vae = diffusers_part(AutoencoderKLLTX2Audio, "audio_vae") if audio else None
        text_encoder = (
            AutoModel.from_pretrained(root / "text_encoder", dtype=dtype).eval().requires_grad_(False)
        )
        if shard_text_encoder:
            text_encoder = shard_frozen(text_encoder, blocks=GEMMA_BLOCKS, device=device)
        encoders = cls(
            vae=vae,
            audio_vae=audio_vae,
            text_encoder=ready(text_encoder),
            tokenizer=tokenizer,
            connectors=connectors,
            device=device,
            dtype=dtype,
            sharded=shard_text_encoder,
        )
        return encoders

    def release_text_side(self) -> None:
        """Drop Gemma-3, its tokenizer and the connectors (what a run keeps for decoding: the VAEs), and
        free their memory; :meth:`encode_text` is refused afterwards."""
        self.text_encoder = self.connectors = self.tokenizer = None
        empty = getattr(getattr(torch, self.device.type, None), "empty_cache", None)
        if self.device.type != "cpu" and callable(empty):
            empty()

    @torch.no_grad()
    def encode_text(self, prompt: str, max_length: int) -> dict[str, torch.Tensor]:
        """Gemma-3 hidden states of every layer -> connectors -> video/audio text embeddings + mask."""
        if self.text_encoder is None or self.connectors is None:
            raise RuntimeError("LTX2Encoders.encode_text after release_text_side: the text encoder is gone")
        tokens = self.tokenizer(
            [prompt.strip()],
            padding="max_length",
            max_length=max_length,
            truncation=True,
            return_tensors="pt",
        )
        ids, mask = tokens.input_ids.to(self.device), tokens.attention_mask.to(self.device)
        hidden = self.text_encoder(
            input_ids=ids, attention_mask=mask, output_hidden_states=True
        ).hidden_states
        packed = torch.stack(hidden, dim=-1).flatten(2, 3).to(self.dtype)  # [1, S, D * (layers + 1)]
        video, audio, text_mask = self.connectors(packed, mask, padding_side="left")
        return {
            "prompt_embeds": video[0],
            "audio_prompt_embeds": audio[0],
            "prompt_attention_mask": text_mask[0],
        }

    @torch.no_grad()
    def encode_video(self, video: torch.Tensor) -> torch.Tensor:
        """``[3, T, H, W]`` in [-1, 1] -> normalized latents ``[C, F, h, w]`` (posterior mode)."""
        z = self.vae.encode(video[None].to(self.device, self.dtype)).latent_dist.mode()
        vae = self.vae
        return Upstream._normalize_latents(z, vae.latents_mean, vae.latents_std, vae.config.scaling_factor)[0]

    @torch.no_grad()
    def encode_audio(self, wave: torch.Tensor) -> torch.Tensor:
        """Stereo ``[2, N]`` -> normalized audio latents ``[C, L, M]`` (posterior mode)."""
        assert self.audio_vae is not None
        cfg = self.audio_vae.config
        mel = log_mel(wave.float(), sample_rate=cfg.sample_rate, hop_length=cfg.mel_hop_length, n_fft=self.n_fft,
                      mel_bins=cfg.mel_bins)  # fmt: skip
        z = self.audio_vae.encode(mel[None].to(self.device, self.dtype)).latent_dist.mode()  # [1, C, L, M]
        packed = Upstream._normalize_audio_latents(
            Upstream._pack_audio_latents(z), self.audio_vae.latents_mean, self.audio_vae.latents_std
        )
        return Upstream._unpack_audio_latents(packed, z.shape[2], z.shape[3])[0]


def clip_rate(path: str) -> float:
    """The frame rate of a clip as its header gives it (a caption folder's rows name none);
    :data:`IMAGE_FRAME_RATE` for an image (a header without a rate)."""
    return probe_video(path).fps or IMAGE_FRAME_RATE


def clips_without_audio(dataset: VideoTextDataset) -> list[tuple[int, str]]:
    """``(index, path)`` of every clip row whose file has no audio track (images, refused apart, and files
    that cannot be opened, which the cache writer reports as failed, left out)."""
    rows = enumerate(dataset.rows)
    return [
        (i, str(row["path"]))
        for i, row in rows
        if not is_image(row["path"]) and has_audio_track(row["path"]) is False
    ]


def refuse_missing_audio(
    dataset: VideoTextDataset, silent: list[tuple[int, str]], missing: MissingAudio
) -> None:
    """Under ``missing_audio: refuse``, refuse the ``silent`` clips (:func:`clips_without_audio`), naming each.

    Raises:
        MissingAudioError: listing every clip without an audio track (index and file), and what to do.
    """
    if missing != "refuse" or not silent:
        return
    lines = [f"{dataset.metadata_path}: {len(silent)} clip(s) without an audio track in an LTX-2 source with audio "
             "(data.dataset.preprocess.audio: true, missing_audio: refuse); expected every clip with sound: set "
             "data.dataset.preprocess.missing_audio: silence to train them with silence, or leave them out"]  # fmt: skip
    lines += [f"  sample {i} ({path})" for i, path in silent]
    raise MissingAudioError("\n".join(lines))


def missing_audio_note(silent: list[tuple[int, str]], missing: MissingAudio) -> list[str]:
    """The report's lines naming the clips encoded without an audio track of their own (what they got)."""
    given = {"silence": "silence (zeros)", "tone": "a stand-in tone"}.get(missing)
    if given is None or not silent:
        return []
    head = f"{len(silent)} clip(s) without an audio track, encoded with {given} (missing_audio: {missing}):"
    return [head, *(f"  [{i}] {path}" for i, path in silent)]


def content_tone(item: dict[str, Any]) -> int:
    """The stand-in tone of a silent clip, from its content (``clip_sha256``, set by the cache writer), so
    that it follows the clip and not its row; the row index for an item read outside the cache writer."""
    digest = item.get("clip_sha256")
    return int(digest[:8], 16) if digest else int(item["index"])


def encode_sample(
    encoders: LTX2Encoders,
    item: dict[str, Any],
    *,
    frame_rate: float,
    max_length: int,
    path: str | None = None,
    missing_audio: MissingAudio = "refuse",
) -> dict[str, Any]:
    """Everything one cached sample holds (tensors on CPU) for a ``VideoTextDataset`` item; a clip without
    an audio track (or no ``path``) as ``missing_audio`` says (:func:`clip_waveform`)."""
    out: dict[str, Any] = {"latents": encoders.encode_video(item["video"])}
    out.update(encoders.encode_text(item["prompt"], max_length))
    if encoders.audio_vae is not None:
        seconds = item["video"].shape[1] / frame_rate
        wave = clip_waveform(path, sample_rate=encoders.audio_vae.config.sample_rate, seconds=seconds,
                             start_s=float(item.get("start_s", 0.0)), missing=missing_audio,
                             tone=content_tone(item))  # fmt: skip
        out["audio_latents"] = encoders.encode_audio(wave)
    out["frame_rate"] = torch.tensor(frame_rate, dtype=torch.float32)
    out["metadata"] = {"prompt": item["prompt"]}
    return {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in out.items()}


def source_dataset(options: PreprocessOptions) -> VideoTextDataset:
    """The clips to encode, at the configured size and frame count (caption chosen as at epoch 0)."""
    return VideoTextDataset(
        options.source, data_root=options.source_root, num_frames=options.num_frames, height=options.height,
        width=options.width, fps=options.fps, frame_rule=options.frame_rule, frame_offset=options.frame_offset,
    )  # fmt: skip


def refuse_images(dataset: VideoTextDataset, *, audio: bool) -> None:
    """With ``audio``, refuse a source that lists images, naming each, before any encoder loads: LTX-2 trains
    a clip's frames with the sound of the same span, and an image has no sound (its audio latents would be
    a stand-in tone one frame long). A video-only source (``audio: false``) may list images: each is a
    one-frame sample (one latent frame of the video VAE, whose frame rule 8k+1 holds it at k = 0).

    Raises:
        mm_trainer.SampleFramesError: listing every image row (index and file), and what to do.
    """
    images = [(i, row["path"]) for i, row in enumerate(dataset.rows) if is_image(row["path"])]
    if audio and images:
        lines = [f"{dataset.metadata_path}: {len(images)} image(s) in an LTX-2 source with audio "
                 "(data.dataset.preprocess.audio: true); LTX-2 trains a clip's frames with their sound, and an "
                 "image has no sound: train images in a video-only run (data.dataset.preprocess.audio: false "
                 "and model.pipeline.audio: false, where an image is a one-frame sample), or list clips only"]  # fmt: skip
        lines += [f"  sample {i} ({path})" for i, path in images]
        raise SampleFramesError("\n".join(lines))


def preprocess_options(config: TrainConfig | DataConfig) -> PreprocessOptions:
    """``data.dataset.preprocess`` of an ``ltx2_precomputed`` config (or of its ``data`` section), validated."""
    return preprocess_section(
        config, dataset_id="ltx2_precomputed", schema=PreprocessOptions, tool="ltx2-train preprocess"
    )


def encoders_identity(options: PreprocessOptions, out_dir: str) -> dict[str, Any]:
    """What the cached tensors depend on besides the sample: the model set's weights and the encoding
    options."""
    root = Path(options.model_root)
    parts = ["vae", "text_encoder", "tokenizer", "connectors", *(["audio_vae"] if options.audio else [])]
    release = {"release_file": Path(options.release_file)} if options.release_file else {}
    return {
        "encoder": "ltx2-train preprocess", "version": ENCODE_VERSION, "dtype": options.dtype,
        "max_sequence_length": options.max_sequence_length, "audio": options.audio, "fps": options.fps,
        "missing_audio": options.missing_audio,
        "weights": weights_identity(out_dir, {name: root / name for name in parts} | release),
    }  # fmt: skip


def target_rate(options: PreprocessOptions, row: dict[str, Any]) -> float:
    """The frame rate a row's clip is cached at: ``data.dataset.preprocess.fps``, else the row's ``fps``, else
    its header's; refused when none is usable."""
    rate = float(options.fps or row.get("fps") or clip_rate(row["path"]))
    if not math.isfinite(rate) or rate <= 0:
        raise ValueError(f"{row['path']}: no usable frame rate ({rate}); set data.dataset.preprocess.fps")
    return rate


def run_preprocess(
    config: TrainConfig, *, rank: int | None = None, world_size: int | None = None
) -> CacheReport:
    """Encode what ``data.data_path`` does not hold yet; under ``torchrun`` the ranks split the clips.
    ``rank`` / ``world_size`` default to (and must agree with) torchrun's."""
    options = preprocess_options(config)
    device, env_rank, env_world = preprocess_ranks(options.device)
    if (rank, world_size) not in ((None, None), (env_rank, env_world)):
        raise ValueError(
            f"rank={rank}, world_size={world_size}: this process is rank {env_rank} of {env_world}"
        )
    dtype = parse_dtype(options.dtype, key="data.dataset.preprocess.dtype") or torch.float32
    dataset = source_dataset(options)  # first: a bad source fails before any model loads
    refuse_images(dataset, audio=options.audio)
    silent = clips_without_audio(dataset) if options.audio else []
    refuse_missing_audio(dataset, silent, options.missing_audio)
    has_references = check_references(dataset, options, lambda row: target_rate(options, row))
    if has_references:
        key_references(dataset, options)
    references = reference_paths(dataset, options)
    check_preprocess_model_set(options)  # parts of two releases, a clip size the VAE refuses: before loading
    run = options.run
    shard = use_text_encoder_fsdp(run.text_encoder_fsdp, weights=Path(options.model_root) / "text_encoder",
                                  world_size=env_world)  # fmt: skip
    encoders = LTX2Encoders.load(options.model_root, audio=options.audio, device=device, dtype=dtype,
                                 shard_text_encoder=shard, release_file=options.release_file)  # fmt: skip
    if run.vae_tiling:
        enable_vae_tiling(encoders.vae, run.vae_tile)
    out = str(config.data.data_path)

    def encode(item: dict[str, Any]) -> dict[str, Any]:
        index = int(item["index"])
        row, rate = dataset.rows[index], target_rate(options, dataset.rows[index])
        out = encode_sample(encoders, item, frame_rate=rate, max_length=options.max_sequence_length,
                            path=str(row["path"]), missing_audio=options.missing_audio)  # fmt: skip
        if references[index] is not None:
            out.update(encode_reference(encoders, references[index], row["reference_sha256"],
                                        num_frames=options.num_frames, height=options.height,
                                        width=options.width, rate=rate,
                                        missing_audio=options.missing_audio))  # fmt: skip
        return out

    def idle() -> None:
        encoders.encode_text("", options.max_sequence_length)

    report = write_latent_cache(
        dataset, encode, out, run=run, identity=encoders_identity(options, out), uses_prompt=True,
        idle=idle if encoders.sharded else None, recipe=preprocess_recipe(options),
    )  # fmt: skip
    report.notes += missing_audio_note(silent, options.missing_audio)
    return report
