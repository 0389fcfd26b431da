"""The Wan2.2 container: frozen ``ae`` and ``text_encoder``, trainable ``predictor``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from mm_pipelines import (
    DiffusionDPO,
    DiffusionNFT,
    DistributionMatchingDistillation,
    FlowGRPO,
    with_distillation,
)
from mm_trainer import ModelContainer, model_register

from wan22_train.distill import (
    CRITIC,
    TEACHER,
    architecture_problems,
    check_distillation_models,
    distillation_pipeline,
)
from wan22_train.dpo import dpo_problems, preference_pipeline
from wan22_train.grpo import grpo_pipeline, grpo_problems
from wan22_train.nft import nft_pipeline, nft_problems
from wan22_train.pipeline import LOW_NOISE_ROLE, OTHER_EXPERT_ROLE, Wan22Pipeline, low_noise_role
from wan22_train.planning import CACHED_DATASET, clip_shapes, latent_grid, planning_batch
from wan22_train.sampling import sample_video

VALIDATION_SHIFT = 5.0
"""The sampling time shift of validation clips when ``training.validation.shift`` is unset."""


def _no_shapes(dataset: str) -> ValueError:
    return ValueError(
        f"data.packing: dataset {dataset} does not give its samples' shapes (latent_shapes as the caches do, "
        "or buckets and bucket_ids as video_text does); packing needs each sample's token count before training"
    )


@model_register("wan2_2_container")
class Wan22Container(ModelContainer):
    """Sub-models ``ae`` (Wan VAE), ``text_encoder`` (UMT5), ``predictor`` (Wan DiT) and, for
    ``expert: both``, ``predictor_low`` (the low-noise A14B expert); for a one-expert A14B run
    (``expert: high_noise | low_noise``) that samples validation clips, ``predictor_other``: the
    other expert, frozen, loaded from its own source (``model.models.predictor_other``).

    Only the predictor(s) train, switch to train mode and are checkpointed (one checkpoint holds
    both experts); the frozen parts reload from their pretrained sources on resume.
    """

    def __init__(self, sub_models: Mapping[str, Any], **kwargs: Any) -> None:
        saved = ("predictor", LOW_NOISE_ROLE, CRITIC, low_noise_role(CRITIC))  # the critics: distillation
        self.checkpoint_submodels = tuple(n for n in saved if n in sub_models)
        super().__init__(sub_models, **kwargs)
        if isinstance(self.pipeline, DistributionMatchingDistillation):
            check_distillation_models(sub_models, self.trainable_submodels, self.pipeline.base.expert)

    @classmethod
    def sub_model_problems(cls, model_section: Any) -> dict[str, str]:
        """A distillation's students and critics whose architecture is not their teacher's
        (:func:`wan22_train.distill.architecture_problems`), a Diffusion-DPO, Flow-GRPO or DiffusionNFT run
        without a reference (:func:`wan22_train.dpo.dpo_problems`, :func:`wan22_train.grpo.grpo_problems`,
        :func:`wan22_train.nft.nft_problems`), before anything is built."""
        return (
            architecture_problems(model_section)
            | dpo_problems(model_section)
            | grpo_problems(model_section)
            | nft_problems(model_section)
        )

    @classmethod
    def build_pipeline(
        cls, options: Mapping[str, Any]
    ) -> Wan22Pipeline | DistributionMatchingDistillation | DiffusionDPO | FlowGRPO | DiffusionNFT:
        """``Wan22Pipeline``; with ``distill``, DMD2 around it (:mod:`wan22_train.distill`); with ``dpo``,
        Diffusion-DPO around it (:mod:`wan22_train.dpo`); with ``grpo``, Flow-GRPO (:mod:`wan22_train.grpo`);
        with ``nft``, DiffusionNFT (:mod:`wan22_train.nft`)."""
        options = dict(options)
        dpo, grpo, nft = options.pop("dpo", None), options.pop("grpo", None), options.pop("nft", None)
        pipeline = with_distillation(options, Wan22Pipeline.from_options, distillation_pipeline)
        if grpo is not None:
            return grpo_pipeline(pipeline, grpo)
        if nft is not None:
            return nft_pipeline(pipeline, nft)
        return pipeline if dpo is None else preference_pipeline(pipeline, dpo)

    @property
    def flow_pipeline(self) -> Wan22Pipeline:
        """The flow-match pipeline (under a distillation's, Diffusion-DPO's, Flow-GRPO's or DiffusionNFT's, the one it
        wraps)."""
        return getattr(self.pipeline, "base", self.pipeline)

    @torch.no_grad()
    def decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """Clips ``[N, 3, F, H, W]`` in [-1, 1] of normalised latents ``[N, C, T, h, w]`` (the ``ae``): a reward
        fine-tuning's rollouts, for the rewards that score frames."""
        return self.ae.decode(latents)

    def packing_tokens(self, dataset: Any) -> list[int]:
        """Each sample's predictor tokens, for ``data.packing`` (``mm_data.TokenBalancedSampler``): from
        its latent shape (:meth:`sample_latent_shapes`) and the predictor's patch. Every task packs (i2v and
        ti2v samples carry their own conditions: ``mm_pipelines.FlowMatchT2VPipeline``).

        Raises:
            ValueError: samples whose shapes are unknown (:meth:`sample_latent_shapes`).
        """
        return [self.predictor.tokens_per_sample(shape) for shape in self.sample_latent_shapes(dataset)]

    def sample_latent_shapes(self, dataset: Any) -> list[tuple[int, int, int, int]]:
        """Each sample's latent shape ``(0, T, h, w)`` (the channels left out): stated by a latent cache
        (``latent_shapes``, ``mm_data.CachedVideoTextDataset``: no VAE needed), else from its bucket's frames
        and size (``buckets`` and ``bucket_ids``, ``video_text``) and the VAE's compression.

        Raises:
            ValueError: a dataset that states neither, a cached row without ``latents``, or a clip
                dataset without the VAE sub-model ``ae``.
        """
        cached = getattr(dataset, "latent_shapes", None)
        if cached is not None:
            missing = [i for i, shape in enumerate(cached) if shape is None or len(shape) != 4]
            if missing:
                raise ValueError(
                    f"data.packing: cached samples {missing[:5]} have no latents [C, T, h, w] to count tokens by"
                )
            return [(0, *shape[1:]) for shape in cached]
        buckets, ids = getattr(dataset, "buckets", None), getattr(dataset, "bucket_ids", None)
        if buckets is None or ids is None:
            raise _no_shapes(type(dataset).__name__)
        grids = self._latent_grids([(b.num_frames, b.height, b.width) for b in buckets])
        return [grids[i] for i in ids]

    def packing_shapes(self, data: Any) -> dict[tuple[int, int, int], int]:
        """``{(frames, height, width): predictor tokens}`` of every clip shape ``data`` can yield (its
        buckets), for ``mm-train plan``'s packed micro-batches (:mod:`mm_trainer.planner.packing`); the
        same counts as :meth:`packing_tokens`, from the config instead of the dataset.

        Raises:
            ValueError: a task other than t2v or the encoder cache (the planner's packed micro-batch is t2v
                clips of the buckets' shapes), or no VAE sub-model (``ae``).
        """
        task = self.flow_pipeline.task
        if task != "t2v" or data.dataset_id == CACHED_DATASET:
            what = f"model.pipeline.task={task}" if task != "t2v" else f"the encoder cache ({CACHED_DATASET})"
            raise ValueError(
                f"mm-train plan: a packed run of {what} is not planned (the planner packs t2v clips of the "
                "buckets' shapes); plan it without data.packing for an estimate"
            )
        shapes = clip_shapes(dict(data.dataset or {}))
        return {
            clip: self.predictor.tokens_per_sample(grid)
            for clip, grid in zip(shapes, self._latent_grids(shapes), strict=True)
        }

    def _latent_grids(self, clips: list[tuple[int, int, int]]) -> list[tuple[int, int, int, int]]:
        """Latent shape ``(0, T, h, w)`` of each clip ``(frames, height, width)``: the VAE's compression."""
        if "ae" not in self.sub_model_names:
            raise ValueError(
                "data.packing: the token count of a clip needs the VAE sub-model `ae` (its compression)"
            )
        t, s = self.ae.temporal_compression, self.ae.spatial_compression
        return [(0, *latent_grid(clip, t, s)) for clip in clips]

    @classmethod
    def checks_sample_frames(cls, model_section: Any) -> bool:
        """Whether :meth:`sample_frame_problems` may refuse a sample: ``ti2v`` (its loss leaves out the clean
        first latent frame, so a sample needs two); t2v and i2v run one-frame samples (images; i2v then
        predicts its own condition)."""
        return dict(getattr(model_section, "pipeline", None) or {}).get("task") == "ti2v"

    def sample_frame_problems(self, dataset: Any) -> dict[int, str]:
        """``{dataset index: why}`` of the samples whose bucket has fewer than 2 latent frames in a ``ti2v``
        run (an image: 1 frame), from the buckets (``video_text``) and the VAE's temporal compression."""
        buckets, ids = getattr(dataset, "buckets", None), getattr(dataset, "bucket_ids", None)
        if (
            self.flow_pipeline.task != "ti2v"
            or buckets is None
            or ids is None
            or "ae" not in self.sub_model_names
        ):
            return {}
        t = self.ae.temporal_compression
        short = {
            b: bucket.num_frames for b, bucket in enumerate(buckets) if (bucket.num_frames - 1) // t + 1 < 2
        }
        return {
            i: f"{short[b]} frame(s) make 1 latent frame; model.pipeline.task=ti2v trains on the latent frames "
            f"after the clean first one, so it needs at least {t + 1} frames (train images with t2v or i2v)"
            for i, b in enumerate(ids)
            if b in short
        }

    def planning_batch(
        self, data: Any, micro_batch_size: int, pack: Mapping[tuple[int, int, int], int] | None = None
    ) -> dict[str, Any]:
        """A micro-batch of the run's real shapes for ``mm-train plan`` (:mod:`wan22_train.planning`);
        ``pack``: a packed one of that many samples of each clip shape (``data.packing``)."""
        return planning_batch(self, data, micro_batch_size, pack)

    # ------------------------------------------------------ validation hooks (training.validation)
    @property
    def has_sample_reference(self) -> bool:
        """Whether validation compares each clip with the teacher's (a distillation run)."""
        return isinstance(self.pipeline, DistributionMatchingDistillation)

    def sample_reference(
        self, prompt: str, *, seed: int, num_frames: int, height: int, width: int
    ) -> torch.Tensor:
        """The teacher's clip for ``prompt`` and ``seed``: ``distill.teacher_steps`` Euler steps at the
        pipeline's shift with the teacher's guidance, the same starting noise as :meth:`sample`."""
        dmd = self.pipeline
        modules = {**self.sampling_modules(), "predictor": self.teacher}
        if LOW_NOISE_ROLE in modules:
            modules[LOW_NOISE_ROLE] = getattr(self, low_noise_role(TEACHER))
        return sample_video(
            modules, prompt, num_frames=num_frames, height=height, width=width, steps=dmd.teacher_steps,
            shift=dmd.base.scheduler.shift, guidance=dmd.guidance_scale, negative_prompt=dmd.negative_prompt,
            seed=seed, device=next(self.teacher.parameters()).device,
        )  # fmt: skip

    def check_sampling(self) -> None:
        """Raise before training when :meth:`sample` could not run: a one-expert A14B run samples
        with the other expert too, which must be the sub-model ``predictor_other``."""
        self.sampling_modules()

    def sampling_modules(self) -> dict[str, Any]:
        """The modules :func:`wan22_train.sampling.sample_video` takes: ``ae``, ``text_encoder``,
        the high-noise ``predictor`` and, with two experts, ``predictor_low`` and the
        ``boundary_timestep`` below which it denoises."""
        modules: dict[str, Any] = {
            "ae": self.ae,
            "text_encoder": self.text_encoder,
            "predictor": self.predictor,
        }
        pipeline = self.flow_pipeline
        expert = pipeline.expert
        if expert == "all":
            return modules
        if expert == "both":
            modules[LOW_NOISE_ROLE] = getattr(self, LOW_NOISE_ROLE)
        elif OTHER_EXPERT_ROLE not in self.sub_model_names:
            raise ValueError(
                f"training.validation: model.pipeline.expert={expert} trains one A14B expert, and sampling a clip "
                f"needs the other one: add it as the frozen sub-model model.models.{OTHER_EXPERT_ROLE} "
                "(model_id wan2_2_predictor, from_pretrained: the other expert's transformer folder, freeze: true), "
                "or leave training.validation.prompts empty"
            )
        elif expert == "high_noise":
            modules[LOW_NOISE_ROLE] = getattr(self, OTHER_EXPERT_ROLE)
        else:
            modules["predictor"], modules[LOW_NOISE_ROLE] = getattr(self, OTHER_EXPERT_ROLE), self.predictor
        modules["boundary_timestep"] = pipeline.boundary_timestep()
        return modules

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
        fps: int | None = None,
    ) -> torch.Tensor:
        """One clip ``[3, F, H, W]`` in ``[-1, 1]`` (Euler flow-match sampling, noise from ``seed``) at the
        time ``shift`` (None: :data:`VALIDATION_SHIFT`); ``fps`` is only the written clip's (the Wan DiT
        takes no frame rate).
        Every rank calls it alike: the sharded sub-models' forwards gather over ranks. A distillation's
        student samples on its own schedule (the sigmas it trained on: ``student_steps`` at ``student_shift``
        from ``student_sigma_max``, no guidance: it was trained to draw the guided teacher's distribution),
        whatever ``steps`` / ``shift`` say."""
        sigmas = None
        if self.has_sample_reference:
            sigmas, guidance_scale = self.pipeline.student_sigmas(), 1.0
        device = next(self.predictor.parameters()).device
        shift = VALIDATION_SHIFT if shift is None else shift
        return sample_video(
            self.sampling_modules(), prompt, num_frames=num_frames, height=height, width=width, steps=steps,
            shift=shift, guidance=guidance_scale, negative_prompt=negative_prompt, seed=seed, device=device,
            sigmas=sigmas,
        )  # fmt: skip
