"""The LTX-2 container: the transformer ``model`` of a run (the single-model form ``model.model_id:
ltx2_predictor`` is held in it too) or several LTX-2 transformers in one run (a distillation's student
``model``, frozen ``teacher`` and fake-score ``critic``), with the hooks of ``training.validation``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from mm_pipelines import DistributionMatchingDistillation
from mm_trainer import ModelContainer, SampledClip, model_register

from ltx2_train.decoding import audio_waveforms, decode_audio, decode_video, load_audio_vae, load_video_vae
from ltx2_train.distill import STUDENT, architecture_problems, check_models, run_pipeline
from ltx2_train.modality import freeze_branch
from ltx2_train.model_set import run_problems
from ltx2_train.pipeline import LTX2Pipeline, patch_grid_problem, video_patch
from ltx2_train.preprocess import preprocess_options
from ltx2_train.reward_modes import reward_mode_problems
from ltx2_train.validation import SamplingSet, prepare_sampling, sample_validation_clip


@model_register("ltx2_container")
class LTX2Container(ModelContainer):
    """LTX-2 transformers by name, the one that trains being ``model`` (the single-model form's only one).

    With ``model.pipeline.distill`` the container must hold ``model`` (the student), ``teacher``
    (frozen) and ``critic``; the trainable ones are checkpointed, the teacher reloads from its source.
    ``training.validation`` samples ``model``'s clips with their audio (:mod:`ltx2_train.validation`); the
    pipeline's ``validation_loss`` gives ``val_loss``. ``model.pipeline.frozen_modality`` freezes that
    branch of a trained ``model`` here, before LoRA, FSDP and the optimizer see it
    (:func:`ltx2_train.modality.freeze_branch`).
    """

    def __init__(self, sub_models: Mapping[str, Any], **kwargs: Any) -> None:
        super().__init__(sub_models, **kwargs)
        if isinstance(self.pipeline, DistributionMatchingDistillation):
            check_models(sub_models, self.trainable_submodels)
        frozen = getattr(self.flow_pipeline, "frozen_modality", "none")
        #: The parameter paths of ``model`` that ``frozen_modality`` froze (empty without one).
        self.frozen_branch: list[str] = []
        if frozen != "none" and self.is_trainable(STUDENT):
            self.frozen_branch = freeze_branch(getattr(self, STUDENT), frozen)
        self._sampling: SamplingSet | None = None
        self._video_vae: Any = None  # prepare_decoding: a reward fine-tuning's rewards on frames
        self._audio_vae: Any = None  # prepare_decoding: its rewards on audio

    @classmethod
    def sub_model_problems(cls, model_section: Any) -> dict[str, str]:
        """A distillation's student or critic whose architecture is not the teacher's
        (:func:`ltx2_train.distill.architecture_problems`), a reward fine-tuning without its policy or
        reference (:func:`ltx2_train.reward_modes.reward_mode_problems`), and a LoRA ``model`` with
        ``frozen_modality``, before anything is built."""
        problems = architecture_problems(model_section) | reward_mode_problems(model_section)
        frozen = dict(getattr(model_section, "pipeline", None) or {}).get("frozen_modality", "none")
        student = model_section.sub_models().get(STUDENT)
        if frozen != "none" and getattr(student, "lora", None) is not None:
            problems[STUDENT] = (
                f"model.pipeline.frozen_modality={frozen} with LoRA: the adapters decide what trains (LoRA "
                f"freezes the rest); target only the other branch's modules in model.lora and set "
                "frozen_modality: none"
            )
        return problems

    @classmethod
    def model_set_problems(cls, config: Any) -> list[str]:
        """The trained transformer (its checkpoint's config or metadata) against the text side and the video
        VAE the cache is encoded with (``data.dataset.preprocess.model_root``'s configs): no weights read, asked
        by ``mm_trainer.check_model_set`` before anything is built (:func:`ltx2_train.model_set.run_problems`).
        A run without that section, or whose model root holds none of those configs, is not checked."""
        preprocess = dict(getattr(config.data, "dataset", None) or {}).get("preprocess") or {}
        return run_problems(config.model.sub_models().get(STUDENT), preprocess)

    @classmethod
    def checks_sample_frames(cls, model_section: Any) -> bool:
        """Whether :meth:`sample_frame_problems` may refuse a sample: conditioning on leading frames
        (``model.pipeline.first_frame_conditioning_p`` > 0) needs frames after them to generate, and a
        video-only run (``model.pipeline.audio: false``) may hold images, whose one latent frame the
        transformer's ``patch_size_t`` must tile."""
        options = dict(getattr(model_section, "pipeline", None) or {})
        conditioning = float(options.get("first_frame_conditioning_p") or 0.0) > 0.0
        return conditioning or not options.get("audio", True)

    def sample_frame_problems(self, dataset: Any) -> dict[int, str]:
        """``{dataset index: why}`` of the cached samples the run cannot train for their ``latents`` shape
        (``mm_data.PrecomputedLatentDataset.latent_shapes``): a latent grid the transformer's patches do not
        tile (:func:`ltx2_train.pipeline.patch_grid_problem`: an image's one frame under ``patch_size_t`` >
        1), or no frame left to generate after the conditioning ones
        (:meth:`ltx2_train.pipeline.LTX2Pipeline.frame_count_problem`: an image only when every sample is
        conditioned)."""
        pipeline, shapes = self.flow_pipeline, getattr(dataset, "latent_shapes", None)
        if shapes is None:
            return {}
        patch_size, patch_size_t = video_patch(getattr(self, STUDENT))
        problems = {}
        for i, shape in enumerate(shapes):
            if shape is None or len(shape) != 4:
                continue
            why = patch_grid_problem(shape[1:], patch_size, patch_size_t) or pipeline.frame_count_problem(
                shape[1]
            )
            if why is not None:
                problems[i] = why
        return problems

    @classmethod
    def build_pipeline(cls, options: Mapping[str, Any]) -> Any:
        """``LTX2Pipeline``; with ``distill``, DMD2 around it (:mod:`ltx2_train.distill`); with ``grpo`` /
        ``nft``, Flow-GRPO / DiffusionNFT around it (:mod:`ltx2_train.reward_modes`)."""
        return run_pipeline(options)

    @property
    def flow_pipeline(self) -> LTX2Pipeline:
        """The flow-match pipeline (under a distillation's or a reward fine-tuning's, the one it wraps)."""
        return getattr(self.pipeline, "base", self.pipeline)

    # ------------------------------------------------------ a reward fine-tuning's rollouts (training.rewards)
    def prepare_decoding(
        self,
        *,
        data: Any,
        device: torch.device,
        planned: bool = False,
        frames: bool = True,
        audio: bool = False,
    ) -> list[torch.nn.Module]:
        """Before training, when a reward scores ``frames`` or ``audio``: load the VAEs the cache was encoded
        with (``data.dataset.preprocess``: the video VAE, the audio VAE) on ``device``, for
        :meth:`decode_latents` and :meth:`decode_audio` (``planned``: their architecture on meta, no weights
        read, for ``plan``); the VAEs, for the planner to count.

        Raises:
            ValueError: the run has no ``data.dataset.preprocess`` (where the VAEs are), or a reward on audio
                and no audio stream (``model.pipeline.audio: false``).
        """
        if audio and not self.flow_pipeline.audio:
            raise ValueError(
                "training.rewards score audio, and model.pipeline.audio is false (no audio stream)"
            )
        try:
            options = preprocess_options(data)
        except ValueError as e:
            raise ValueError(
                "training.rewards score decoded clips: LTX-2 decodes the rollouts with the VAEs the cache was "
                f"written with, named by data.dataset.preprocess ({e})"
            ) from None
        loaded = []
        if frames:
            self._video_vae = load_video_vae(options, device, torch.float32, planned=planned)
            loaded.append(self._video_vae)
        if audio:
            self._audio_vae = load_audio_vae(options, device, torch.float32, planned=planned)
            loaded.append(self._audio_vae)
        return loaded

    @torch.no_grad()
    def decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """Clips ``[N, 3, F, H, W]`` in [-1, 1] of normalised video latents ``[N, C, F', H', W']`` (a reward
        fine-tuning's rollouts: ``LTX2Pipeline.scored_latents``), for the rewards that score frames."""
        if self._video_vae is None:
            raise RuntimeError(
                "LTX2Container.decode_latents before prepare_decoding: the trainer calls it first"
            )
        return decode_video(self._video_vae, latents)

    @torch.no_grad()
    def decode_audio(self, latents: torch.Tensor) -> tuple[torch.Tensor, int]:
        """``(waveforms [N, 2, S], sample rate)`` of normalised audio latents ``[N, C, L, M]`` (a reward
        fine-tuning's rollouts: ``LTX2Pipeline.scored_audio``): the audio VAE's log-mel, then Griffin-Lim
        (:mod:`ltx2_train.decoding`), for the rewards that score audio."""
        if self._audio_vae is None:
            raise RuntimeError(
                "LTX2Container.decode_audio before prepare_decoding: the trainer calls it first"
            )
        return audio_waveforms(self._audio_vae, decode_audio(self._audio_vae, latents))

    def planning_batch(self, data: Any, micro_batch_size: int) -> dict[str, Any]:
        """A micro-batch of the run's real shapes for ``mm-train plan`` (:mod:`ltx2_train.planning`)."""
        return self.flow_pipeline.planning_batch(self, data, micro_batch_size)

    # ------------------------------------------------------ validation hooks (training.validation)
    def prepare_sampling(self, validation: Any, *, data: Any, device: torch.device) -> None:
        """Before training: the frozen encoders of ``data.dataset.preprocess`` on ``device``, every prompt
        encoded once, Gemma-3 released (:func:`ltx2_train.validation.prepare_sampling`)."""
        self._sampling = prepare_sampling(
            validation, data=data, device=device, model=self.model, audio=self.flow_pipeline.audio,
            distilled=isinstance(self.pipeline, DistributionMatchingDistillation),
        )  # fmt: skip

    def sample(
        self,
        prompt: str,
        *,
        seed: int,
        num_frames: int,
        height: int,
        width: int,
        steps: int,
        guidance_scale: float,
        negative_prompt: str,
        shift: float | None,
        fps: int,
        audio_guidance_scale: float | None = None,
    ) -> SampledClip:
        """One clip of ``model`` and its audio (a distillation's student on its own schedule): every rank
        calls it alike (:func:`ltx2_train.validation.sample_validation_clip`)."""
        if self._sampling is None:
            raise RuntimeError(
                "LTX2Container.sample before prepare_sampling: the trainer's Validator calls it first"
            )
        return sample_validation_clip(
            self, self.pipeline, self._sampling, prompt, seed=seed, num_frames=num_frames, height=height,
            width=width, steps=steps, guidance_scale=guidance_scale, negative_prompt=negative_prompt, shift=shift,
            fps=fps, audio_guidance_scale=audio_guidance_scale,
        )  # fmt: skip
