"""``ltx2-train sample``: a clip (and its audio) from a trained LTX-2 transformer, Euler flow matching.

The prompt goes through the run's frozen text side (Gemma-3 + connectors, as ``preprocess`` encodes
captions); video and audio start as noise of the cached latents' shapes and take ``steps`` Euler
steps ``x + (sigma_next - sigma) v`` on one sigma grid: ``linspace(1, 0)`` with the time shift
``exp(mu)``, ``mu`` the training sampler's logit-normal shift for the clip's video token count (the
logit of a shifted sigma is the logit of the plain one plus ``mu``). A distilled run
(``model.pipeline.distill``) samples its student on the sigmas it trained on instead: ``steps`` Euler
steps of its schedule (``student_sigmas``: ``distill.shift`` or ``student_shift``, from
``student_sigma_max`` times the noise). The predictor sees timestep ``1000 sigma`` for both streams, as
in training (:meth:`LTX2Pipeline.predict`; an LTX-2.3 / 2.5 transformer also as its prompt modulation's
``sigma`` / ``audio_sigma``, with the cross timestep). The text side is the run's model set's: a 2.3 set's
connectors give the per-modality widths that transformer takes. Latents are de-normalised with the VAEs'
statistics and decoded: video to ``[3, F, H, W]`` in ``[-1, 1]``, audio to a log-mel spectrogram,
which :func:`write_sample` turns into a waveform by Griffin-Lim (no vocoder is used, the tiny model
set has none).
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any

import torch
from mm_checkpoint import DistributedCheckpointer
from mm_config import TrainConfig
from mm_data import to_video_frames, write_clip, write_wav
from mm_pipelines import DistributionMatchingDistillation, FlowMatchScheduler
from mm_trainer import ModelContainer, freeze, import_plugins, inject_lora

from ltx2_train.decoding import audio_waveforms, decode_audio, decode_video
from ltx2_train.distill import run_pipeline
from ltx2_train.pipeline import LTX2Pipeline, unpack_audio, unpack_video, video_patch
from ltx2_train.predictor import LTX2Predictor
from ltx2_train.preprocess import LTX2Encoders, preprocess_options
from ltx2_train.references import encode_reference, reference_clip_problem


def load_for_sampling(config: TrainConfig, checkpoint: str | Path) -> dict[str, Any]:
    """The trained transformer restored from ``checkpoint`` (``holder``: its container; a distillation's
    student; a LoRA run's base loaded from its source and its adapters from ``checkpoint``), the run's pipeline (``distillation``: the DMD2 around it, or None), and the frozen encoders
    of ``data.dataset.preprocess.model_root`` (CPU, fp32)."""
    import_plugins(config.training.plugin)
    args = config.model.sub_models()["model"]
    model = LTX2Predictor.from_pretrained(args) if args.lora else LTX2Predictor.build_from_config(args)
    freeze(model)
    holder = ModelContainer({"model": model}, trainable=("model",))
    inject_lora(holder, {"model": args.lora})  # a LoRA run: its base from its source, its adapters restored
    DistributedCheckpointer(checkpoint).load({"model": holder})
    built = run_pipeline(config.model.pipeline or {})  # the run's pipeline, as training built it
    distillation = built if isinstance(built, DistributionMatchingDistillation) else None
    pipeline: LTX2Pipeline = getattr(built, "base", built)
    options = preprocess_options(config)
    encoders = LTX2Encoders.load(options.model_root, audio=pipeline.audio, device=torch.device("cpu"),
                                 dtype=torch.float32)  # fmt: skip
    return {
        "holder": holder,
        "pipeline": pipeline,
        "distillation": distillation,
        "encoders": encoders,
        "text_len": options.max_sequence_length,
        "missing_audio": options.missing_audio,
    }


def latent_grid(encoders: LTX2Encoders, num_frames: int, height: int, width: int) -> tuple[int, int, int]:
    """The video latent grid ``(F, H, W)`` of a clip, or a ValueError naming the VAE's compression."""
    vae = encoders.vae
    t, s = vae.temporal_compression_ratio, vae.spatial_compression_ratio
    if (num_frames - 1) % t or height % s or width % s:
        raise ValueError(
            f"frames-1 must divide by {t} and height/width by {s}; got {num_frames}x{height}x{width}"
        )
    return (1 + (num_frames - 1) // t, height // s, width // s)


@torch.no_grad()
def sample_clip(
    modules: dict[str, Any],
    prompt: str,
    *,
    num_frames: int,
    height: int,
    width: int,
    frame_rate: float,
    steps: int | None = 20,
    seed: int = 0,
    guidance_scale: float = 1.0,
    audio_guidance_scale: float | None = None,
    negative_prompt: str = "",
    shift: float | None = None,
    texts: dict[str, dict[str, torch.Tensor]] | None = None,
    device: torch.device | str = "cpu",
    reference: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(video [3, F, H, W] in [-1, 1], log-mel [2, T, mel_bins] or None without audio)`` for
    ``prompt``, on CPU; the same ``seed`` gives the same clip (the noise is drawn on the CPU from it).

    ``steps`` Euler steps (a distilled student: None = its own ``student_steps``) at the time ``shift``
    (None: ``exp(mu)`` of the clip's token count; a student samples its own schedule); classifier-free
    guidance against ``negative_prompt`` at ``guidance_scale`` on the video and ``audio_guidance_scale``
    (None: ``guidance_scale``) on the audio, as diffusers' ``LTX2Pipeline`` takes them: the unconditional
    forward runs when either is not 1, and a stream at 1 keeps its conditional velocity.
    ``texts`` holds the prompts' embeddings already encoded (:meth:`LTX2Encoders.encode_text`), else the
    encoders encode them; the transformer runs on ``device``. ``reference``: the IC-LoRA reference clip
    (``num_frames`` frames at ``frame_rate``) of a run trained with ``model.pipeline.reference``, its tokens in
    context at every step as in training; None samples such a run without one (the reference tokens left
    out of the sequence)."""
    encoders: LTX2Encoders = modules["encoders"]
    pipeline: LTX2Pipeline = modules["pipeline"]
    holder = modules["holder"]
    if audio_guidance_scale is not None and not pipeline.audio:
        raise ValueError(
            "audio_guidance_scale: this run samples no audio (model.pipeline.audio: false); leave it out"
        )
    grid = latent_grid(encoders, num_frames, height, width)
    references = reference_latents(
        pipeline,
        encoders,
        reference,
        num_frames,
        height,
        width,
        frame_rate,
        modules.get("missing_audio", "refuse"),
    )
    if reference is None:
        pipeline = pipeline.without_reference()
    generator = torch.Generator().manual_seed(seed)
    video = torch.randn((1, encoders.vae.config.latent_channels, *grid), generator=generator)
    audio = _audio_noise(encoders, num_frames / frame_rate, generator) if pipeline.audio else None

    def conditions(text: str) -> dict[str, Any]:
        embeds = texts[text] if texts is not None else encoders.encode_text(text, modules["text_len"])
        batch = {
            "latents": video,
            "frame_rate": torch.tensor([frame_rate]),
            **{k: v[None] for k, v in embeds.items()},
        }
        if audio is not None:
            batch["audio_latents"] = audio
        batch.update({k: v[None] for k, v in references.items()})
        return pipeline.prepare_conditions(holder, {k: v.to(device) for k, v in batch.items()})

    state = conditions(prompt)
    scales = {
        "video": guidance_scale,
        "audio": guidance_scale if audio_guidance_scale is None else audio_guidance_scale,
    }
    unconditional = conditions(negative_prompt) if set(scales.values()) != {1.0} else None
    sigmas = sampling_sigmas(modules, state["video"].shape[1], steps, shift=shift).to(device)
    for name in pipeline.state_streams:  # the start: sigmas[0] x the noise (1 x, unless a student's)
        state[name] = state[name] * sigmas[0]

    def velocity(at: dict[str, Any], sigma: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        noised = {**at, "noisy_video": state["video"], "video_timestep": sigma, "sigma": sigma,
                  "noisy_audio": state.get("audio")}  # fmt: skip
        return pipeline.predict(holder, noised)

    for i in range(len(sigmas) - 1):
        sigma = sigmas[i].reshape(1)
        v_video, v_audio = velocity(state, sigma)
        if unconditional is not None:
            u_video, u_audio = velocity({**state, **_text_of(unconditional)}, sigma)
            v_video = guided(v_video, u_video, scales["video"])
            v_audio = guided(v_audio, u_audio, scales["audio"])
        state["video"] = FlowMatchScheduler.step(v_video, sigmas[i], sigmas[i + 1], state["video"])
        if audio is not None:
            state["audio"] = FlowMatchScheduler.step(v_audio, sigmas[i], sigmas[i + 1], state["audio"])
    latents = unpack_video(state["video"], grid, *video_patch(pipeline.submodule(holder, "predictor")))
    return _decode_video(encoders, latents).cpu(), (
        _decode_audio(encoders, state["audio"], audio.shape).cpu() if audio is not None else None
    )


def guided(conditional: torch.Tensor, unconditional: torch.Tensor, scale: float) -> torch.Tensor:
    """Classifier-free guidance ``u + scale (c - u)`` (``c`` itself at scale 1). Diffusers' ``LTX2Pipeline``
    guides the x0 predictions, ``x - sigma v``: at one ``x`` and sigma the same velocity."""
    return conditional if scale == 1.0 else unconditional + scale * (conditional - unconditional)


def reference_latents(
    pipeline: LTX2Pipeline, encoders: LTX2Encoders, reference: str | None, num_frames: int, height: int,
    width: int, frame_rate: float, missing_audio: str = "refuse",
) -> dict[str, torch.Tensor]:  # fmt: skip
    """The cached-sample entries of the reference clip ``reference`` (``reference_latents`` and, with audio,
    ``reference_audio_latents``: :func:`ltx2_train.references.encode_reference`; a silent one as the run's
    ``missing_audio``); {} without one. A clip of other frames or rate than the sample's, or one given to a run
    trained without references, is refused."""
    if reference is None:
        return {}
    if pipeline.reference == "none":
        raise ValueError(f"--reference {reference}: this run was trained without references "
                         "(model.pipeline.reference: none)")  # fmt: skip
    problem = reference_clip_problem(reference, num_frames, frame_rate)
    if problem is not None:
        raise ValueError(f"--reference: {problem} (--frames, --fps)")
    digest = hashlib.sha256(Path(reference).read_bytes()).hexdigest()
    return encode_reference(encoders, reference, digest, num_frames=num_frames, height=height, width=width,
                            rate=frame_rate, missing_audio=missing_audio)  # fmt: skip


def _text_of(conditions: dict[str, Any]) -> dict[str, Any]:
    """The text entries of :meth:`LTX2Pipeline.prepare_conditions`' output (what guidance swaps)."""
    return {k: conditions[k] for k in ("text", "audio_text", "text_mask")}


def sampling_sigmas(
    modules: dict[str, Any], video_tokens: int, steps: int | None, *, shift: float | None = None
) -> torch.Tensor:
    """The sigmas :func:`sample_clip` steps through: a distilled student's own schedule (``steps`` of it,
    None: its ``student_steps``), else ``steps`` on ``linspace(1, 0)`` at ``shift`` (None: ``exp(mu)`` of
    ``video_tokens`` tokens)."""
    if modules.get("distillation") is not None:
        return modules["distillation"].student_sigmas(steps)
    if steps is None:
        raise ValueError("sampling steps are required (only a distilled student has a schedule of its own)")
    pipeline: LTX2Pipeline = modules["pipeline"]
    shift = math.exp(pipeline.sampler.shift(video_tokens)) if shift is None else shift
    scheduler = FlowMatchScheduler(shift=shift)
    scheduler.set_inference_timesteps(steps)
    assert scheduler.inference_sigmas is not None
    return scheduler.inference_sigmas


def _audio_noise(encoders: LTX2Encoders, seconds: float, generator: torch.Generator) -> torch.Tensor:
    """Noise shaped like the audio latents ``[1, C, L, M]`` of a clip of ``seconds`` (as preprocess encodes)."""
    rate = encoders.audio_vae.config.sample_rate
    shape = encoders.encode_audio(torch.zeros(2, int(round(seconds * rate)))).shape
    return torch.randn((1, *shape), generator=generator)


def _decode_video(encoders: LTX2Encoders, latents: torch.Tensor) -> torch.Tensor:
    return decode_video(encoders.vae, latents)[0]


def _decode_audio(encoders: LTX2Encoders, tokens: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    return decode_audio(encoders.audio_vae, unpack_audio(tokens.reshape(1, shape[2], -1), shape[1]))[0]


def write_sample(
    modules: dict[str, Any], video: torch.Tensor, mel: torch.Tensor | None, out: str | Path, *, fps: int
) -> list[Path]:
    """Write ``video`` as an H.264 mp4 at ``out`` and, with audio, the Griffin-Lim waveform of ``mel``
    as ``out`` with a ``.wav`` suffix; returns the paths written."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_clip(out, to_video_frames(video), fps=fps)
    if mel is None:
        return [out]
    wave, rate = waveform(modules["encoders"], mel)
    return [out, write_wav(out.with_suffix(".wav"), wave, rate)]


def waveform(encoders: LTX2Encoders, mel: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``(waveform [2, N], sample rate)`` of a sampled log-mel: Griffin-Lim (the tiny set has no vocoder)."""
    waves, rate = audio_waveforms(encoders.audio_vae, mel[None])
    return waves[0], rate
