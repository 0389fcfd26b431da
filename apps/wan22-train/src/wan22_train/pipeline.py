"""Wan2.2 training pipeline: flow matching on VAE latents with UMT5 text, per task and expert."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from mm_parallel import parse_dtype
from mm_pipelines import FlowMatchT2VPipeline

from wan22_train.config_schema import SCHEDULER_KEYS
from wan22_train.experts import expert_scheduler, handover_index, handover_timestep

LOW_NOISE_ROLE = "predictor_low"
#: The frozen other A14B expert of a one-expert run, for sampling validation clips only.
OTHER_EXPERT_ROLE = "predictor_other"


class Wan22Pipeline(FlowMatchT2VPipeline):
    """``FlowMatchT2VPipeline`` that tokenizes ``prompt`` strings with the text encoder's tokenizer.

    Options (YAML ``model.pipeline``): ``task`` (t2v | i2v | ti2v), ``expert`` (high_noise |
    low_noise | all | both: the A14B timestep split of docs/DESIGN.md
    "Wan2.2 expert split", the whole range for TI2V-5B, or
    both A14B experts in one run: sub-models ``predictor`` (high noise) and ``predictor_low``; the grid
    index is drawn once per optimizer step from the step's key (``SampleRNG``), so every micro-batch
    and rank of a step trains the same expert, at any layout and without a broadcast),
    ``boundary`` (override of the expert split), the scheduler keys (``shift``, ``sigma_min``,
    ``extra_one_step``, ``num_train_timesteps``, ``sigma_max``, ``weighting``) and
    ``predict_dtype``.
    """

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> Wan22Pipeline:
        options = dict(options)
        task = options.pop("task", "t2v")
        expert = options.pop("expert", "all")
        boundary = options.pop("boundary", None)
        predict_dtype = parse_dtype(options.pop("predict_dtype", None), key="model.pipeline.predict_dtype")
        sched_kwargs = {k: options.pop(k) for k in SCHEDULER_KEYS if k in options}
        if options:
            raise ValueError(f"model.pipeline: unknown Wan pipeline options {sorted(options)}")
        scheduler = expert_scheduler(expert, task, boundary, **sched_kwargs)
        timesteps_per = "step" if expert == "both" else "sample"
        pipeline = cls(scheduler, task=task, predict_dtype=predict_dtype, timesteps_per=timesteps_per)
        pipeline.expert, pipeline.boundary = expert, boundary
        if expert == "both":
            pipeline.boundary_index = handover_index(scheduler, task, boundary)
        return pipeline

    #: Grid index where the low-noise expert takes over (``expert: both`` only).
    boundary_index: int | None = None
    #: ``model.pipeline.expert``: high_noise | low_noise | all | both.
    expert: str = "all"
    #: ``model.pipeline.boundary``: the expert split as a fraction of the grid (None: the task's).
    boundary: float | None = None

    def boundary_timestep(self) -> float:
        """The timestep where the low-noise A14B expert takes over from the high-noise one (the
        edge of a one-expert run's training range, or the ``expert: both`` routing split)."""
        return handover_timestep(self.scheduler, self.expert, self.task, self.boundary)

    def predict(self, container: Any, noised: dict[str, Any]) -> torch.Tensor:
        """TI2V: per-token timesteps, 0 on the clean first frame (as Wan2.2 TI2V-5B trains).
        ``expert: both``: the step's grid index picks the expert that predicts."""
        if self.task == "ti2v":
            noised = {**noised, "timestep": self._first_frame_clean_timesteps(container, noised)}
        if self.boundary_index is None:
            return super().predict(container, noised)
        high = int(noised["indices"][0]) < self.boundary_index
        roles = self.roles
        current = roles.get("predictor", "predictor")  # distillation runs teacher / critic through this role
        self.roles = {**roles, "predictor": current if high else low_noise_role(current)}
        try:
            return super().predict(container, noised)
        finally:
            self.roles = roles

    def _first_frame_clean_timesteps(
        self, container: Any, noised: dict[str, Any]
    ) -> torch.Tensor | list[torch.Tensor]:
        # timestep [B] -> [B, S] over post-patch tokens (frame-major), 0 for the first latent frame's tokens;
        # packed (one latent shape per sample): per sample its [S_i]
        pt, ph, pw = self.submodule(container, "predictor").config.patch_size
        if pt != 1:
            raise ValueError(f"ti2v needs a temporal patch size of 1 to keep the first frame clean, got {pt}")
        shapes = noised["latent_shape"]
        if isinstance(shapes, list):
            return [
                _first_frame_clean(noised["timestep"][i : i + 1], t, (h // ph) * (w // pw))[0]
                for i, (_, t, h, w) in enumerate(shapes)
            ]
        _, _, t, h, w = shapes
        return _first_frame_clean(noised["timestep"], t, (h // ph) * (w // pw))

    def metrics(self, container: Any, noised: dict[str, Any]) -> dict[str, float]:
        """``num_samples``, ``num_tokens`` and the step's ``flops`` (for MFU)."""
        out = super().metrics(container, noised)
        predictor = self.submodule(container, "predictor")
        counter = getattr(predictor, "training_flops", None)
        if callable(counter) and isinstance(noised["latent_shape"], list):  # packed: per-sample shapes
            texts = noised["encoder_hidden_states"]
            out["flops"] = sum(
                counter(predictor.tokens_per_sample(shape), text.shape[0])
                for shape, text in zip(noised["latent_shape"], texts, strict=True)
            )
        elif callable(counter):
            b = noised["latent_shape"][0]
            text_tokens = noised["encoder_hidden_states"].shape[1]
            out["flops"] = counter(int(out["num_tokens"] // b), text_tokens) * b
        return out

    def encode_prompt(self, container: Any, batch: Mapping[str, Any]) -> torch.Tensor:
        """Tokenize ``batch["prompt"]`` with the text encoder's tokenizer unless ids are given."""
        if "prompt_embeds" not in batch and "input_ids" not in batch and "prompt" in batch:
            encoder = self.submodule(container, "text_encoder")
            device = _device_of(batch)
            batch = {**batch, **encoder.tokenize(batch["prompt"], device)}
        return super().encode_prompt(container, batch)


def _first_frame_clean(timestep: torch.Tensor, frames: int, per_frame: int) -> torch.Tensor:
    """``[B]`` timesteps as ``[B, frames * per_frame]`` per token, 0 on the first frame's tokens."""
    per_token = timestep[:, None].repeat(1, frames * per_frame)
    per_token[:, :per_frame] = 0
    return per_token


def low_noise_role(role: str) -> str:
    """The low-noise expert's sub-model of ``role``: ``predictor_low`` for ``predictor``, ``teacher_low`` for
    ``teacher``, ``critic_low`` for ``critic`` (``expert: both``)."""
    return f"{role}_low"


def _device_of(batch: Mapping[str, Any]) -> torch.device:
    for value in batch.values():
        if isinstance(value, torch.Tensor):
            return value.device
    return torch.device("cpu")
