"""LTX-2 audio+video flow matching on precomputed latents and text embeddings.

Per micro-batch (``x0`` = clean latents as tokens: :func:`pack_video` with the transformer's
``patch_size`` / ``patch_size_t``, in upstream ``LTX2Pipeline._pack_latents``'s order; ``eps`` ~ N(0, I)); every draw is per sample from
the micro-batch's :class:`mm_pipelines.SampleRNG` (purposes ``sigma``, ``first_frame_conditioning``,
``noise``, ``audio_noise``, ``audio_sigma``), so a sample trains the same at any layout:

1. one ``sigma`` per sample from :class:`~ltx2_train.timesteps.SigmaSampler` (token count = video
   tokens); the audio's sigma is the same (``audio_timesteps: shared``, the default) or a second draw of
   the sampler keyed apart (``independent``: purpose ``audio_sigma``);
2. optional conditioning on leading frames: with probability ``first_frame_conditioning_p`` a sample's
   first ``conditioning_frames`` latent frames are given clean (``sigma = 0`` and timestep 0 on those
   tokens; 1 frame: I2V, K frames: video extension; refused when ``patch_size_t`` > 1, whose tokens mix
   frames, and for a clip of no more than K latent frames); a sample of one latent frame (an image, in a
   video-only run) is never conditioned (its only frame would leave nothing to generate): it trains as
   text to image, and is refused only when ``first_frame_conditioning_p`` is 1;
3. ``x_sigma = (1 - sigma) x0 + sigma eps``; the predictor gets ``timestep = 1000 sigma`` (per
   token for video when any token is conditioned, else per sample) and ``audio_timestep = 1000
   audio_sigma``; an LTX-2.3 / 2.5 transformer also gets the per-sample ``1000 sigma`` / ``1000
   audio_sigma`` as its prompt modulation's ``sigma`` / ``audio_sigma`` and the cross timestep, as
   diffusers' pipelines give them (:mod:`ltx2_train.release_inputs`);
4. target ``eps - x0``; loss = MSE over the video tokens that are not conditioning tokens
   + ``audio_loss_weight`` x audio MSE over the audio tokens that are not (fp32), less the stream of
   ``frozen_modality`` (``audio``: video loss alone, the audio branch frozen; ``video``: the audio loss
   alone, T2A). Both streams' MSEs are reported (``loss_video``, ``loss_audio``), the frozen one's too.

Clean context (:mod:`ltx2_train.conditioning`): ``condition_modality`` gives one stream whole at sigma 0
(A2V: ``audio``, V2A: ``video``; no loss, none reported); ``audio_conditioning_frames`` K gives every
sample's first K audio latent frames at sigma 0 (audio extension: per-token audio timestep, no loss on them);
``reference`` appends the reference clip's video and / or audio tokens (batch ``reference_latents``,
``reference_audio_latents``) after the target's in the transformer's input, clean, at timestep 0 and at
diffusers' IC-LoRA positions; their outputs are dropped, so no loss reaches them.

Held-out samples (``training.validation.data_path``, :meth:`LTX2Pipeline.validation_loss`): the same loss
without conditioning frames at ``num_timesteps`` fixed sigmas ``(k + 1/2) / num_timesteps``, with one noise
draw per sample (purposes ``noise`` and ``audio_noise`` of the held-out sample's key) shared by them, and
each stream's MSE beside it (``val_loss_video``, ``val_loss_audio``).

Batch keys (from ``ltx2-train preprocess``): ``latents [B, C, F, H, W]``, ``prompt_embeds [B, S, D]``,
``prompt_attention_mask [B, S]``, optional ``audio_prompt_embeds``, ``audio_latents [B, C, L, M]``,
``frame_rate [B]``, with ``reference``: ``reference_latents [B, C, F', H', W']`` and / or
``reference_audio_latents [B, C, L', M]``. Without audio (``audio: false``, the T2V recipe) the audio stream gets a few zero
tokens, modality cross-attention is off and audio contributes no loss.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch
from mm_pipelines import FlowMatchScheduler, GenerativePipelineBase, SampleRNG

from ltx2_train.conditioning import leading_frames_mask, with_references
from ltx2_train.config_schema import (
    PIPELINE_KEYS,
    SAMPLER_KEYS,
    AudioTimesteps,
    ConditionModality,
    FrozenModality,
    Reference,
    conditioning_problems,
)
from ltx2_train.planning import planning_batch
from ltx2_train.release_inputs import release_of, sigma_inputs, text_width_problem
from ltx2_train.timesteps import SigmaSampler


def patch_grid_problem(grid: tuple[int, ...], patch_size: int = 1, patch_size_t: int = 1) -> str | None:
    """Why the transformer's patches do not tile the latent grid ``(F, H, W)`` (an image's one latent frame
    under ``patch_size_t`` > 1, say), or None when they do."""
    frames, height, width = grid
    if not (frames % patch_size_t or height % patch_size or width % patch_size):
        return None
    return (
        f"latent grid (frames, height, width) = {tuple(grid)} does not divide into the transformer's "
        f"patches (patch_size_t={patch_size_t}, patch_size={patch_size}); choose a clip size whose "
        "latent frames divide by patch_size_t and latent height/width by patch_size"
    )


def check_patch_grid(grid: tuple[int, int, int], patch_size: int = 1, patch_size_t: int = 1) -> None:
    """Refuse a latent grid ``(F, H, W)`` that the transformer's patches do not tile
    (:func:`patch_grid_problem`)."""
    problem = patch_grid_problem(grid, patch_size, patch_size_t)
    if problem is not None:
        raise ValueError(problem)


def pack_video(latents: torch.Tensor, patch_size: int = 1, patch_size_t: int = 1) -> torch.Tensor:
    """``[B, C, F, H, W]`` -> ``[B, (F/pt)(H/p)(W/p), C*pt*p*p]``, upstream ``LTX2Pipeline._pack_latents``'s
    order: tokens by patch frame, row, column; features by channel, then the patch's frame, row, column."""
    batch, channels, frames, height, width = latents.shape
    check_patch_grid((frames, height, width), patch_size, patch_size_t)
    pt, p = patch_size_t, patch_size
    patches = latents.reshape(batch, channels, frames // pt, pt, height // p, p, width // p, p)
    return patches.permute(0, 2, 4, 6, 1, 3, 5, 7).flatten(4, 7).flatten(1, 3)


def unpack_video(
    tokens: torch.Tensor, grid: tuple[int, int, int], patch_size: int = 1, patch_size_t: int = 1
) -> torch.Tensor:
    """The inverse of :func:`pack_video`: ``[B, S, D]`` -> ``[B, C, F, H, W]`` for the latent ``grid`` ``(F, H, W)``."""
    frames, height, width = grid
    check_patch_grid(grid, patch_size, patch_size_t)
    pt, p = patch_size_t, patch_size
    patches = tokens.reshape(tokens.shape[0], frames // pt, height // p, width // p, -1, pt, p, p)
    return patches.permute(0, 4, 1, 5, 2, 6, 3, 7).reshape(tokens.shape[0], -1, frames, height, width)


def video_patch(model: Any) -> tuple[int, int]:
    """``(patch_size, patch_size_t)`` of an ``LTX2VideoTransformer3DModel`` (its config)."""
    return int(model.config.patch_size), int(model.config.patch_size_t)


def pack_audio(latents: torch.Tensor) -> torch.Tensor:
    """``[B, C, L, M]`` -> ``[B, L, C*M]`` (upstream ``LTX2Pipeline._pack_audio_latents`` layout)."""
    return latents.transpose(1, 2).flatten(2, 3)


def unpack_audio(tokens: torch.Tensor, channels: int) -> torch.Tensor:
    """The inverse of :func:`pack_audio`: ``[B, L, C*M]`` -> ``[B, C, L, M]`` for ``channels`` ``C``."""
    return tokens.unflatten(2, (channels, tokens.shape[2] // channels)).transpose(1, 2)


def first_frame_token_mask(
    batch: int, frames: int, tokens_per_frame: int, probability: float, *, generator: torch.Generator | None = None,
    device: torch.device | str | None = None, conditioning_frames: int = 1,
) -> torch.Tensor:  # fmt: skip
    """``[B, F*H*W]`` bool: True on the first ``conditioning_frames`` latent frames' tokens of samples drawn
    with ``probability``."""
    chosen = torch.rand(batch, generator=generator, device=device) < probability
    first = torch.zeros(frames * tokens_per_frame, dtype=torch.bool, device=device)
    first[: conditioning_frames * tokens_per_frame] = True
    return chosen[:, None] & first[None, :]


def validation_sigmas(num_timesteps: int) -> list[float]:
    """The fixed sigmas of the held-out loss: the midpoints ``(k + 1/2) / n`` of ``n`` equal parts of (0, 1)."""
    if num_timesteps < 1:
        raise ValueError(f"num_timesteps={num_timesteps}: expected >= 1")
    return [(k + 0.5) / num_timesteps for k in range(num_timesteps)]


def per_sample_mse(
    prediction: torch.Tensor, target: torch.Tensor, keep: torch.Tensor | None = None
) -> torch.Tensor:
    """``[B]``: each sample's fp32 mean of squared errors (over the tokens where ``keep`` ``[B, S]`` is True)."""
    err = (prediction.float() - target.float()).pow(2)
    if keep is None:
        return err.flatten(1).mean(dim=1)
    weight = keep.to(err.dtype)[..., None].expand_as(err)
    return (err * weight).flatten(1).sum(dim=1) / weight.flatten(1).sum(dim=1).clamp_min(1.0)


def masked_mse(
    prediction: torch.Tensor, target: torch.Tensor, keep: torch.Tensor | None = None
) -> torch.Tensor:
    """fp32 mean of squared errors over tokens where ``keep`` ``[B, S]`` is True (all when None)."""
    err = (prediction.float() - target.float()).pow(2)
    if keep is None:
        return err.mean()
    weight = keep.to(err.dtype)[..., None].expand_as(err)
    return (err * weight).sum() / weight.sum().clamp_min(1.0)


class LTX2Pipeline(GenerativePipelineBase):
    """Flow matching for ``LTX2VideoTransformer3DModel`` (the container's ``model`` sub-model).

    Its flow state (:class:`mm_pipelines.FlowState`, what a distillation around it acts on) is the packed
    ``video`` tokens and, with ``audio``, the packed ``audio`` tokens, at one sigma per sample."""

    #: The sigma grid of a distillation around this pipeline (``model.pipeline.distill.shift``:
    #: its timesteps and the student's schedule); ordinary training draws sigmas from ``sampler``.
    scheduler: FlowMatchScheduler | None = None

    def __init__(
        self,
        sampler: SigmaSampler | None = None,
        *,
        audio: bool = True,
        audio_timesteps: AudioTimesteps = "shared",
        frozen_modality: FrozenModality = "none",
        condition_modality: ConditionModality = "none",
        reference: Reference = "none",
        first_frame_conditioning_p: float = 0.0,
        conditioning_frames: int = 1,
        audio_conditioning_frames: int = 0,
        audio_loss_weight: float = 1.0,
        frame_rate: float = 24.0,
        audio_placeholder_tokens: int = 8,
    ) -> None:
        super().__init__(roles={"predictor": "model"})
        if not 0.0 <= first_frame_conditioning_p <= 1.0:
            raise ValueError(
                f"model.pipeline.first_frame_conditioning_p={first_frame_conditioning_p}: expected in [0, 1]"
            )
        if audio_timesteps not in ("shared", "independent"):
            raise ValueError(
                f"model.pipeline.audio_timesteps={audio_timesteps!r}: expected shared or independent"
            )
        if frozen_modality not in ("none", "audio", "video"):
            raise ValueError(
                f"model.pipeline.frozen_modality={frozen_modality!r}: expected none, audio or video"
            )
        if frozen_modality == "video" and not audio:
            raise ValueError(
                "model.pipeline.frozen_modality=video (audio-only training) needs model.pipeline.audio: true"
            )
        if conditioning_frames < 1:
            raise ValueError(f"model.pipeline.conditioning_frames={conditioning_frames}: expected >= 1")
        if condition_modality not in ("none", "audio", "video"):
            raise ValueError(
                f"model.pipeline.condition_modality={condition_modality!r}: expected none, audio or video"
            )
        if reference not in ("none", "video", "audio", "audio_video"):
            raise ValueError(
                f"model.pipeline.reference={reference!r}: expected none, video, audio or audio_video"
            )
        if audio_conditioning_frames < 0:
            raise ValueError(
                f"model.pipeline.audio_conditioning_frames={audio_conditioning_frames}: expected >= 0"
            )
        problems = conditioning_problems({
            "audio": audio, "condition_modality": condition_modality, "frozen_modality": frozen_modality,
            "reference": reference, "audio_conditioning_frames": audio_conditioning_frames,
            "audio_timesteps": audio_timesteps, "first_frame_conditioning_p": first_frame_conditioning_p,
        })  # fmt: skip
        if problems:
            key, why, _ = problems[0]
            raise ValueError(f"model.pipeline.{key}: {why}")
        self.condition_modality = condition_modality
        self.reference = reference
        self.audio_conditioning_frames = audio_conditioning_frames
        self.conditioning_frames = conditioning_frames
        self.sampler = sampler or SigmaSampler()
        self.audio = audio
        self.audio_timesteps = audio_timesteps
        self.frozen_modality = frozen_modality
        self.first_frame_conditioning_p = first_frame_conditioning_p
        self.audio_loss_weight = audio_loss_weight
        self.frame_rate = frame_rate
        self.audio_placeholder_tokens = audio_placeholder_tokens

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> LTX2Pipeline:
        """Build from YAML ``model.pipeline``: the sampler keys of ``SAMPLER_KEYS`` and the init keywords."""
        options = dict(options)
        sampler = SigmaSampler(
            **{field: options.pop(key) for key, field in SAMPLER_KEYS.items() if key in options}
        )
        unknown = sorted(set(options) - set(PIPELINE_KEYS))
        if unknown:
            raise ValueError(
                f"model.pipeline: unknown LTX-2 pipeline options {unknown}; expected some of "
                f"{sorted([*SAMPLER_KEYS, *PIPELINE_KEYS])}"
            )
        return cls(sampler, **options)

    def without_reference(self) -> LTX2Pipeline:
        """This pipeline with ``reference: none`` (sampling an IC-LoRA run without its reference clip)."""
        plain = copy.copy(self)
        plain.reference = "none"
        return plain

    def planning_batch(self, container: Any, data: Any, micro_batch_size: int) -> dict[str, Any]:
        """A micro-batch of the run's real shapes for ``mm-train plan`` (:mod:`ltx2_train.planning`), with the
        reference clips ``reference`` asks for (``preprocess`` caches them at the target's shape)."""
        batch = planning_batch(
            container, data, micro_batch_size, audio=self.audio, frame_rate=self.frame_rate
        )
        for stream, key in (("video", "latents"), ("audio", "audio_latents")):
            if stream in self.reference:
                batch[f"reference_{key}"] = torch.zeros_like(batch[key])
        return batch

    def conditions_samples_of(self, frames: int) -> bool:
        """Whether a sample of ``frames`` latent frames may be conditioned on its leading frames: never one
        of a single latent frame (an image), which trains unconditioned (text to image) instead."""
        return self.first_frame_conditioning_p > 0 and frames > 1

    def frame_count_problem(self, frames: int) -> str | None:
        """Why a sample of ``frames`` latent frames cannot train, or None: conditioning on the first
        ``conditioning_frames`` leaves no frame to generate (every sample conditioned, or a clip of
        several frames that may be). An image (one latent frame) under a probability below 1 is never
        conditioned (:meth:`conditions_samples_of`), so it trains."""
        p, k = self.first_frame_conditioning_p, self.conditioning_frames
        if p == 0 or frames > k or (frames == 1 and p < 1):
            return None
        fix = "longer clips in preprocess, or fewer conditioning frames"
        if frames == 1:
            fix += ", or first_frame_conditioning_p < 1, under which an image trains unconditioned"
        return (
            f"{frames} latent frame(s) leave none to generate after model.pipeline.conditioning_frames={k} "
            f"given clean (first_frame_conditioning_p={p}); expected more than {k} ({fix})"
        )

    # ------------------------------------------------------------------ stages
    def prepare_conditions(self, container: Any, batch: Mapping[str, Any]) -> dict[str, Any]:
        """Clean latents as token sequences + text embeddings (already encoded offline)."""
        latents = batch["latents"]
        if latents.dim() != 5:
            raise ValueError(f"batch['latents']: expected [B, C, F, H, W], got shape {tuple(latents.shape)}")
        model = self.submodule(container, "predictor")
        release = release_of(model)
        patch_size, patch_size_t = video_patch(model)
        if patch_size_t > 1 and self.first_frame_conditioning_p > 0:
            raise ValueError(
                f"model.pipeline.first_frame_conditioning_p={self.first_frame_conditioning_p} needs the first "
                f"latent frame in tokens of its own, but the transformer's patch_size_t is {patch_size_t}; set it to 0"
            )
        problem = self.frame_count_problem(latents.shape[2])
        if problem is not None:
            raise ValueError(f"batch['latents']: {problem}")
        text, audio_text = batch["prompt_embeds"], batch.get("audio_prompt_embeds", batch["prompt_embeds"])
        problem = text_width_problem(model.config, release, text.shape[-1], audio_text.shape[-1])
        if problem is not None:
            raise ValueError(f"batch['prompt_embeds'] / ['audio_prompt_embeds']: {problem}")
        out = {
            "video": pack_video(latents, patch_size, patch_size_t),
            "grid": tuple(latents.shape[2:]),
            "patch": patch_size,
            "patch_t": patch_size_t,
            "text": text,
            "audio_text": audio_text,
            "text_mask": batch["prompt_attention_mask"],
            "frame_rate": _frame_rate(batch.get("frame_rate"), self.frame_rate),
        }
        if self.audio:
            if "audio_latents" not in batch:
                raise KeyError(
                    "model.pipeline.audio is true but the batch has no 'audio_latents' (preprocess with audio)"
                )
            out["audio"] = pack_audio(batch["audio_latents"])
            out["audio_channels"] = int(batch["audio_latents"].shape[1])
            self._check_audio_frames(out["audio"].shape[1])
        out.update(self._references(batch, patch_size, patch_size_t))
        return out

    def _check_audio_frames(self, frames: int) -> None:
        """Refuse audio of no more latent frames than ``audio_conditioning_frames`` (nothing to generate)."""
        k = self.audio_conditioning_frames
        if k and frames <= k:
            raise ValueError(
                f"batch['audio_latents']: {frames} audio latent frame(s) leave none to generate after "
                f"model.pipeline.audio_conditioning_frames={k}; expected more than {k} (longer clips, or fewer frames)"
            )

    def _references(self, batch: Mapping[str, Any], patch_size: int, patch_size_t: int) -> dict[str, Any]:
        """The packed reference tokens ``model.pipeline.reference`` asks for (IC-LoRA), from the cache's
        ``reference_latents`` / ``reference_audio_latents`` (:mod:`ltx2_train.conditioning`)."""
        out: dict[str, Any] = {}
        wants = {"video": ("reference_latents",), "audio": ("reference_audio_latents",),
                 "audio_video": ("reference_latents", "reference_audio_latents")}.get(self.reference, ())  # fmt: skip
        missing = [key for key in wants if key not in batch]
        if missing:
            raise KeyError(
                f"model.pipeline.reference={self.reference} but the batch has no {missing}: preprocess a source "
                "whose metadata rows name a 'reference' clip (apps/ltx2-train/README.md, IC-LoRA)"
            )
        if "reference_latents" in wants:
            latents = batch["reference_latents"]
            out["reference_video"] = pack_video(latents, patch_size, patch_size_t)
            out["reference_grid"] = tuple(latents.shape[2:])
        if "reference_audio_latents" in wants:
            out["reference_audio"] = pack_audio(batch["reference_audio_latents"])
        return out

    def noising(self, conditions: dict[str, Any], rng: SampleRNG | None = None) -> dict[str, Any]:
        """Sample sigma, noise and conditioning per sample from ``rng``; mix ``x_sigma = (1 - sigma) x0 + sigma eps``."""
        x0 = conditions["video"]
        batch, num_tokens, _ = x0.shape
        rng = self.require_rng(rng, batch)
        frames, height, width = conditions["grid"]
        per_frame = (height // conditions.get("patch", 1)) * (width // conditions.get("patch", 1))
        probability = self.first_frame_conditioning_p if self.conditions_samples_of(frames) else 0.0
        device = x0.device
        sigma = self.sampler.sample_keyed(rng, num_tokens, device=device)
        audio_sigma = sigma
        if self.audio and self.audio_timesteps == "independent":
            audio_sigma = self.sampler.sample_keyed(rng, num_tokens, device=device, purpose="audio_sigma")
        sigma, audio_sigma = self._condition_stream(sigma, audio_sigma)
        conditioned = rng.per_sample(
            "first_frame_conditioning",
            lambda g: first_frame_token_mask(
                1,
                num_tokens // per_frame,
                per_frame,
                probability,
                generator=g,
                device=device,
                conditioning_frames=self.conditioning_frames,
            )[0],
            device,
        )
        eps = rng.randn("noise", x0.shape[1:], dtype=x0.dtype, device=device)
        eps_a = None
        if self.audio:
            a0 = conditions["audio"]
            eps_a = rng.randn("audio_noise", a0.shape[1:], dtype=a0.dtype, device=device)
        return self._mixed(conditions, sigma, conditioned, eps, eps_a, audio_sigma)

    def _condition_stream(
        self, sigma: torch.Tensor, audio_sigma: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(sigma, audio_sigma)`` with the ``condition_modality`` stream's at 0 (given clean, timestep 0)."""
        if self.condition_modality == "video":
            return torch.zeros_like(sigma), audio_sigma
        if self.condition_modality == "audio":
            return sigma, torch.zeros_like(audio_sigma)
        return sigma, audio_sigma

    def _mixed(
        self, conditions: dict[str, Any], sigma: torch.Tensor, conditioned: torch.Tensor, eps: torch.Tensor,
        eps_audio: torch.Tensor | None, audio_sigma: torch.Tensor | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """``x_sigma = (1 - sigma) x0 + sigma eps`` per stream (0 on conditioning tokens) and the targets;
        the audio at ``audio_sigma`` (default: ``sigma``)."""
        audio_sigma = sigma if audio_sigma is None else audio_sigma
        x0 = conditions["video"]
        token_sigma = sigma[:, None] * (~conditioned).to(sigma.dtype)  # [B, S]: 0 on conditioning tokens
        s = token_sigma[..., None].to(x0.dtype)
        noised = {
            **conditions,
            "sigma": sigma,
            "audio_sigma": audio_sigma,
            "conditioned": conditioned,
            "noisy_video": (1 - s) * x0 + s * eps,
            "video_target": eps - x0,
            "video_timestep": token_sigma if bool(conditioned.any()) else sigma,
        }
        if self.audio:
            a0 = conditions["audio"]
            clean = leading_frames_mask(a0.size(0), a0.size(1), self.audio_conditioning_frames, a0.device)
            # [B, L]: 0 on the clean leading frames (audio extension), the sample's sigma elsewhere
            token_audio_sigma = audio_sigma[:, None] * (~clean).to(audio_sigma.dtype)
            sa = token_audio_sigma[..., None].to(a0.dtype)
            noised["noisy_audio"] = (1 - sa) * a0 + sa * eps_audio
            noised["audio_target"] = eps_audio - a0
            noised["audio_conditioned"] = clean
            noised["audio_timestep"] = token_audio_sigma if self.audio_conditioning_frames else audio_sigma
        return noised

    def predict(self, container: Any, noised: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the transformer; returns (video, audio) velocity predictions as token sequences.

        Timesteps are ``timestep_scale_multiplier`` (1000) x sigma: the video's per token (0 on conditioning
        tokens) or per sample, the audio's per sample; an LTX-2.3 / 2.5 transformer also gets each stream's
        per-sample timestep as its prompt-modulation ``sigma`` / ``audio_sigma`` and the cross timestep
        (:mod:`ltx2_train.release_inputs`)."""
        model = self.submodule(container, "predictor")
        scale = float(model.config.timestep_scale_multiplier)
        sigma = noised["sigma"] * scale
        audio_sigma = noised.get("audio_sigma", noised["sigma"]) * scale
        video = noised["noisy_video"]
        frames, height, width = noised["grid"]
        if self.audio:
            audio = noised["noisy_audio"]
        else:
            tokens = self.audio_placeholder_tokens
            audio = video.new_zeros(video.size(0), tokens, model.config.audio_in_channels)
        audio_timestep = noised.get("audio_timestep")
        audio_timestep = audio_sigma if audio_timestep is None else audio_timestep * scale
        tokens = with_references(
            model, noised, video, audio, noised["video_timestep"] * scale, audio_timestep
        )
        video_out, audio_out = model(
            **tokens,
            encoder_hidden_states=noised["text"],
            audio_encoder_hidden_states=noised["audio_text"],
            encoder_attention_mask=noised["text_mask"],
            audio_encoder_attention_mask=noised["text_mask"],
            num_frames=frames, height=height, width=width, fps=noised["frame_rate"],
            audio_num_frames=tokens["audio_hidden_states"].size(1),
            isolate_modalities=not self.audio,
            return_dict=False,
            **sigma_inputs(release_of(model), sigma, audio_sigma),
        )  # fmt: skip
        return video_out[:, : video.size(1)], audio_out[:, : audio.size(1)]  # the references' outputs dropped

    # ------------------------------------------------------------------ flow state
    @property
    def state_streams(self) -> tuple[str, ...]:
        """``("video", "audio")``, or ``("video",)`` without audio."""
        return ("video", "audio") if self.audio else ("video",)

    @property
    def state_weights(self) -> dict[str, float]:
        """Each stream's loss weight: the audio's is ``audio_loss_weight``, as in training."""
        return {"video": 1.0, "audio": self.audio_loss_weight}

    def clean_state(self, conditions: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """The clean tokens of each stream from :meth:`prepare_conditions`."""
        return {name: conditions[name] for name in self.state_streams}

    def scored_latents(
        self, state: Mapping[str, torch.Tensor], conditions: Mapping[str, Any]
    ) -> torch.Tensor:
        """The video latents ``[N, C, F, H, W]`` (normalised, as cached) of a flow ``state``'s packed
        ``video`` tokens, on the latent grid of ``conditions``: what a reward fine-tuning's rewards score
        (``LTX2Container.decode_latents`` decodes them for the rewards on frames)."""
        patch = (conditions.get("patch", 1), conditions.get("patch_t", 1))
        return unpack_video(state["video"], conditions["grid"], *patch)

    def scored_audio(self, state: Mapping[str, torch.Tensor], conditions: Mapping[str, Any]) -> torch.Tensor:
        """The audio latents ``[N, C, L, M]`` (normalised, as cached) of a flow ``state``'s packed ``audio``
        tokens: what a reward on audio scores (``LTX2Container.decode_audio`` decodes them).

        Raises:
            ValueError: a run without the audio stream (``audio: false``).
        """
        if not self.audio:
            raise ValueError(
                "training.rewards score audio, and model.pipeline.audio is false (no audio stream)"
            )
        return unpack_audio(state["audio"], int(conditions["audio_channels"]))

    def state_velocity(
        self, container: Any, role: str, state: Mapping[str, torch.Tensor], sigma: torch.Tensor,
        conditions: Mapping[str, Any],
    ) -> dict[str, torch.Tensor]:  # fmt: skip
        """Sub-model ``role``'s video (and audio) velocity at ``state``, both streams at the per-sample
        ``sigma`` ``[B]`` (timestep ``1000 sigma``, as in training without conditioning frames)."""
        video = state["video"]
        s = sigma.to(device=video.device, dtype=torch.float32)
        noised = {**conditions, "noisy_video": video, "noisy_audio": state.get("audio"), "video_timestep": s,
                  "sigma": s}  # fmt: skip
        with self.acting_as(role):
            v_video, v_audio = self.predict(container, noised)
        return {"video": v_video, "audio": v_audio} if self.audio else {"video": v_video}

    def compute_loss(
        self, prediction: tuple[torch.Tensor, torch.Tensor], noised: dict[str, Any]
    ) -> torch.Tensor:
        """Masked video MSE (non-conditioning tokens) + weighted audio MSE, fp32; the stream of
        ``frozen_modality`` left out (its MSE still reported, without gradient)."""
        video_pred, audio_pred = prediction
        video_loss = audio_loss = None
        if self.condition_modality != "video":
            video_loss = masked_mse(video_pred, noised["video_target"], ~noised["conditioned"])
            noised["video_loss"] = video_loss.detach()
        if self.audio and self.condition_modality != "audio":
            audio_loss = masked_mse(audio_pred, noised["audio_target"], ~noised["audio_conditioned"])
            noised["audio_loss"] = audio_loss.detach()
        return self.training_loss({"video": video_loss, "audio": audio_loss})

    def training_loss(self, per_stream: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The loss that trains, from each stream's MSE: video + ``audio_loss_weight`` x audio, of
        :attr:`trained_streams` only (training's step loss and the held-out ``loss`` alike)."""
        weights = {"video": 1.0, "audio": self.audio_loss_weight}
        terms = [weights[s] * per_stream[s] for s in self.trained_streams]
        return sum(terms[1:], terms[0])

    @property
    def trained_streams(self) -> tuple[str, ...]:
        """The streams whose loss trains: video and (with ``audio``) audio, less ``frozen_modality``'s and
        ``condition_modality``'s."""
        streams = ("video", "audio") if self.audio else ("video",)
        return tuple(s for s in streams if s not in (self.frozen_modality, self.condition_modality))

    # ---------------------------------------------------------- validation
    @torch.no_grad()
    def validation_loss(
        self, container: Any, batch: Mapping[str, Any], rng: SampleRNG, num_timesteps: int
    ) -> dict[str, torch.Tensor]:
        """Per-sample losses ``[B]`` of held-out samples: ``loss``, the training loss (video MSE over every
        token + ``audio_loss_weight`` x audio MSE, of the trained streams: a ``frozen_modality``'s left out as
        in training; no video conditioning frames; the ``condition_modality`` stream
        clean and without loss, the clean ``audio_conditioning_frames`` without loss, the reference tokens in
        context, as in training), and each trained stream's MSE (``loss_video``, with audio ``loss_audio``:
        logged ``val_loss_video`` / ``val_loss_audio``), at the fixed sigmas of :func:`validation_sigmas`,
        averaged. The noise comes from ``rng`` (purposes ``noise`` and ``audio_noise``, one draw per sample
        shared by every sigma): keyed by held-out sample index, it is
        the same at every validation and layout."""
        conditions = self.prepare_conditions(container, batch)
        x0 = conditions["video"]
        size, device = x0.shape[0], x0.device
        eps = rng.randn("noise", x0.shape[1:], dtype=x0.dtype, device=device)
        eps_audio = None
        if self.audio:
            a0 = conditions["audio"]
            eps_audio = rng.randn("audio_noise", a0.shape[1:], dtype=a0.dtype, device=device)
        clean = torch.zeros(x0.shape[:2], dtype=torch.bool, device=device)  # no conditioning tokens
        per_sigma: dict[str, list[torch.Tensor]] = {"loss_video": [], "loss_audio": []}
        for value in validation_sigmas(num_timesteps):
            sigma = torch.full((size,), value, dtype=torch.float32, device=device)
            video_sigma, audio_sigma = self._condition_stream(sigma, sigma)
            noised = self._mixed(conditions, video_sigma, clean, eps, eps_audio, audio_sigma)
            video_pred, audio_pred = self.predict(container, noised)
            if self.condition_modality != "video":
                per_sigma["loss_video"].append(per_sample_mse(video_pred, noised["video_target"]))
            if self.audio and self.condition_modality != "audio":
                audio_mse = per_sample_mse(audio_pred, noised["audio_target"], ~noised["audio_conditioned"])
                per_sigma["loss_audio"].append(audio_mse)
        out = {name: torch.stack(values).mean(dim=0) for name, values in per_sigma.items() if values}
        out["loss"] = self.training_loss({s: out[f"loss_{s}"] for s in self.trained_streams})
        return out

    def metrics(self, container: Any, noised: dict[str, Any]) -> dict[str, float]:
        """``num_samples``, ``num_tokens`` (video + audio, reference tokens included: the transformer computes
        them), the losses of the streams that have one and the step's ``flops`` (for MFU)."""
        batch, video_tokens, _ = noised["video"].shape
        audio_tokens = noised["audio"].shape[1] if self.audio else 0
        video_tokens += noised["reference_video"].shape[1] if "reference_video" in noised else 0
        audio_tokens += noised["reference_audio"].shape[1] if "reference_audio" in noised else 0
        out = {"num_samples": batch, "num_tokens": batch * (video_tokens + audio_tokens)}
        for stream in ("video", "audio"):
            if f"{stream}_loss" in noised:
                out[f"loss_{stream}"] = float(noised[f"{stream}_loss"])
        counter = getattr(self.submodule(container, "predictor"), "training_flops", None)
        if callable(counter):  # without audio the transformer still runs its placeholder audio tokens
            computed_audio = audio_tokens if self.audio else self.audio_placeholder_tokens
            text_tokens = noised["text"].shape[1]
            out["flops"] = batch * counter(video_tokens, computed_audio, text_tokens, cross_modal=self.audio)
        return out


def _frame_rate(value: Any, default: float) -> float:
    if value is None:
        return default
    rates = torch.as_tensor(value).flatten().tolist()
    if len(set(rates)) > 1:
        raise ValueError(
            f"batch['frame_rate']: one frame rate per batch expected (RoPE positions), got {rates}"
        )
    return float(rates[0])
