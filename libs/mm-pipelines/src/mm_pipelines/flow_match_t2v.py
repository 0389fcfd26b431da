"""Generic latent flow-match training for text/image-to-video (Wan2.2 T2V, I2V, TI2V)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import torch

from .conditioning import (
    as_tensor_output,
    first_frame_video,
    i2v_condition,
    masked_text_embeddings,
    replace_first_frame,
)
from .flow_match_scheduler import FlowMatchScheduler
from .keyed_random import SampleRNG
from .pipeline_base import GenerativePipelineBase

Task = Literal["t2v", "i2v", "ti2v"]
TASKS = ("t2v", "i2v", "ti2v")


class FlowMatchT2VPipeline(GenerativePipelineBase):
    """Flow-match training on VAE latents, conditioned on text (and a first frame).

    Sub-model contracts (roles, renamable with ``roles``):
        ``ae``: ``ae.encode(video [B, C, F, H, W]) -> latents [B, c, T, h, w]`` (already
            normalized; method name ``ae_method``). Skipped when the batch has ``latents``.
        ``text_encoder``: ``text_encoder(input_ids=..., attention_mask=...)`` returning
            ``[B, L, D]``, an object with ``last_hidden_state``, or a tuple. Padding positions
            are zeroed. Skipped when the batch has ``prompt_embeds``.
        ``predictor``: ``predictor(hidden_states, timestep [B], encoder_hidden_states)`` returning
            the velocity (tensor, ``.sample`` or tuple); optionally
            ``tokens_per_sample(latent_shape [c, T, h, w]) -> int`` for the ``num_tokens`` metric.

    Tasks:
        ``t2v``: plain text-to-video.
        ``i2v``: predictor input ``cat([x_t, mask, image_latents], dim=1)`` (Wan2.2 I2V A14B,
            16 + 4 + 16 = 36 channels); ``image_latents`` from the batch or ``ae`` on the video
            with frames after the first zeroed.
        ``ti2v``: the noised latents' first frame is the clean first-frame latents and is
            excluded from the loss (Wan2.2 TI2V-5B).

    Noise and grid indices come from ``rng`` (:class:`~mm_pipelines.SampleRNG`), keyed by sample
    and step: ``timesteps_per="sample"`` (default) draws one grid index per sample,
    ``"step"`` one for the whole optimizer step (every micro-batch and rank alike). Either is the
    same at any data-parallel / context-parallel / accumulation layout.

    Packed micro-batches (every task): ``latents`` (or ``video``) a list of per-sample ``[c, T_i, h_i, w_i]``
    (``[C, F_i, H_i, W_i]``) of any shapes and ``prompt_embeds`` a list of ``[L_i, D]`` (or ``[B, L, D]``);
    i2v: ``image_latents`` a list too (or ``ae`` on each sample's first-frame-only video).
    Every sample draws its grid index and noise from its own key exactly as unpacked (the same
    draws for the same sample id) and carries its own conditions (i2v: its mask and image latents
    concatenated on its channels; ti2v: its clean first latent frame, left out of its loss), the predictor
    gets the lists (``predictor([x_0, ...], timestep [B], [text_0, ...])`` returning a list: a packed
    forward such as ``WanDiT``'s) and each sample's loss is its own MSE times its weight, so a sample's
    loss does not depend on how it was packed.
    """

    def __init__(
        self,
        scheduler: FlowMatchScheduler,
        *,
        task: Task = "t2v",
        roles: Mapping[str, str] | None = None,
        timesteps_per: Literal["sample", "step"] = "sample",
        mask_channels: int = 4,
        ae_method: str = "encode",
        predict_dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(roles=roles)
        if task not in TASKS:
            raise ValueError(f"FlowMatchT2VPipeline: task={task!r} is not one of {list(TASKS)}")
        if not isinstance(scheduler, FlowMatchScheduler):
            raise TypeError(
                f"FlowMatchT2VPipeline: scheduler must be a FlowMatchScheduler, got {type(scheduler)}"
            )
        self.scheduler = scheduler
        self.task = task
        if timesteps_per not in ("sample", "step"):
            raise ValueError(
                f"FlowMatchT2VPipeline: timesteps_per={timesteps_per!r} is not one of ['sample', 'step']"
            )
        self.timesteps_per = timesteps_per
        self.mask_channels = mask_channels
        self.ae_method = ae_method
        self.predict_dtype = predict_dtype

    # ---------------------------------------------------------- 1. conditions
    def prepare_conditions(self, container: Any, batch: Mapping[str, Any]) -> dict[str, Any]:
        """Clean latents (fp32), prompt embeddings and, for i2v, the channel condition."""
        latents = self.encode_latents(container, batch)
        conditions = {"latents": latents, "prompt_embeds": self.encode_prompt(container, batch)}
        if self.task == "i2v":
            image_latents = self.encode_image_latents(container, batch)
            if _is_packed(latents):  # each sample's mask and image latents, of its own shape
                conditions["image_condition"] = [
                    i2v_condition(z[None], image[None], self.mask_channels)[0]
                    for z, image in zip(latents, image_latents, strict=True)
                ]
            else:
                conditions["image_condition"] = i2v_condition(latents, image_latents, self.mask_channels)
        return conditions

    def encode_latents(self, container: Any, batch: Mapping[str, Any]) -> torch.Tensor | list[torch.Tensor]:
        """``batch["latents"]`` or ``ae`` on ``batch["video"]``, as fp32 (packed: a list, each sample
        encoded on its own)."""
        if "latents" in batch:
            latents = batch["latents"]
            return [z.float() for z in latents] if _is_packed(latents) else latents.float()
        video = _require(batch, "video", "latents")
        if _is_packed(video):
            return [self._encode_video(container, v[None])[0] for v in video]
        return self._encode_video(container, video)

    def encode_image_latents(
        self, container: Any, batch: Mapping[str, Any]
    ) -> torch.Tensor | list[torch.Tensor]:
        """``batch["image_latents"]`` or ``ae`` on the first-frame-only video (i2v; packed: a list, each
        sample encoded on its own)."""
        if "image_latents" in batch:
            image = batch["image_latents"]
            return [z.float() for z in image] if _is_packed(image) else image.float()
        video = _require(batch, "video", "image_latents")
        if _is_packed(video):
            return [self._encode_video(container, first_frame_video(v[None]))[0] for v in video]
        return self._encode_video(container, first_frame_video(video))

    def encode_prompt(self, container: Any, batch: Mapping[str, Any]) -> torch.Tensor:
        """``batch["prompt_embeds"]`` or the text encoder on ``input_ids`` / ``attention_mask``."""
        if "prompt_embeds" in batch:
            return batch["prompt_embeds"]
        input_ids = _require(batch, "input_ids", "prompt_embeds")
        mask = batch.get("attention_mask")
        out = self.call(container, "text_encoder", input_ids=input_ids, attention_mask=mask)
        return masked_text_embeddings(as_tensor_output(out, "text_encoder"), mask)

    def _encode_video(self, container: Any, video: torch.Tensor) -> torch.Tensor:
        out = self.call(container, "ae", video, method=self.ae_method)
        return as_tensor_output(out, f"ae.{self.ae_method}").float()

    # ------------------------------------------------------------- 2. noising
    def noising(
        self, conditions: dict[str, Any], rng: SampleRNG | None = None, indices: torch.Tensor | None = None
    ) -> dict[str, Any]:
        """Draw grid indices (unless ``indices`` [B] are given) and noise from ``rng``; build
        predictor inputs, target and weight."""
        x0 = conditions["latents"]
        if _is_packed(x0):
            return self._noising_packed(conditions, rng, indices)
        rng = self.require_rng(rng, x0.shape[0])
        sched = self.scheduler
        idx = sched.draw_indices(rng, self.timesteps_per) if indices is None else indices
        noise = rng.randn("noise", x0.shape[1:], device=x0.device)
        x_t = sched.add_noise(x0, noise, sched.sigmas_for(idx))
        if self.task == "ti2v":
            x_t = replace_first_frame(x_t, x0)
        hidden = x_t
        if self.task == "i2v":
            hidden = torch.cat([x_t, conditions["image_condition"].to(x_t.dtype)], dim=1)
        return {
            "hidden_states": hidden,
            "timestep": sched.timesteps_for(idx).to(x0.device),
            "encoder_hidden_states": conditions["prompt_embeds"],
            "target": sched.training_target(x0, noise),
            "weight": sched.weights_for(idx).to(x0.device),
            "indices": idx,
            "latent_shape": tuple(x0.shape),
        }

    def _noising_packed(
        self, conditions: dict[str, Any], rng: SampleRNG | None, indices: torch.Tensor | None
    ) -> dict[str, Any]:
        """:meth:`noising` of a packed micro-batch: per sample, the draws and conditions of the same sample
        unpacked."""
        latents = list(conditions["latents"])
        texts = conditions["prompt_embeds"]
        texts = list(texts.unbind(0)) if isinstance(texts, torch.Tensor) else list(texts)
        if len(texts) != len(latents):
            raise ValueError(f"packed micro-batch: {len(latents)} latents and {len(texts)} prompt_embeds")
        rng = self.require_rng(rng, len(latents))
        sched = self.scheduler
        idx = sched.draw_indices(rng, self.timesteps_per) if indices is None else indices
        generators = rng.sample_generators("noise", latents[0].device)
        noise = [
            torch.randn(tuple(x0.shape), generator=g, device=x0.device) for x0, g in zip(latents, generators)
        ]
        sigmas = sched.sigmas_for(idx)
        images = conditions.get("image_condition") if self.task == "i2v" else None
        hidden = []
        for i, (x0, n) in enumerate(zip(latents, noise, strict=True)):
            x_t = sched.add_noise(x0[None], n[None], sigmas[i : i + 1])
            if self.task == "ti2v":
                x_t = replace_first_frame(x_t, x0[None])
            if images is not None:
                x_t = torch.cat([x_t, images[i][None].to(x_t.dtype)], dim=1)
            hidden.append(x_t[0])
        return {
            "hidden_states": hidden,
            "timestep": sched.timesteps_for(idx).to(latents[0].device),
            "encoder_hidden_states": texts,
            "target": [sched.training_target(x0, n) for x0, n in zip(latents, noise, strict=True)],
            "weight": sched.weights_for(idx).to(latents[0].device),
            "indices": idx,
            "latent_shape": [tuple(x0.shape) for x0 in latents],
        }

    # ------------------------------------------------------------- 3. predict
    def predict(self, container: Any, noised: dict[str, Any]) -> torch.Tensor | list[torch.Tensor]:
        """``predictor(hidden_states, timestep, encoder_hidden_states)`` as a tensor (packed: a list)."""
        hidden, text = noised["hidden_states"], noised["encoder_hidden_states"]
        if _is_packed(hidden):
            if self.predict_dtype is not None:
                hidden = [h.to(self.predict_dtype) for h in hidden]
                text = [t.to(self.predict_dtype) for t in text]
            out = self.call(container, "predictor", hidden, noised["timestep"], text)
            if not _is_packed(out) or len(out) != len(hidden):
                raise TypeError(
                    f"the predictor returned {type(out).__name__} for a packed micro-batch of {len(hidden)} "
                    "samples; a packed forward returns one tensor per sample"
                )
            return list(out)
        if self.predict_dtype is not None:
            hidden, text = hidden.to(self.predict_dtype), text.to(self.predict_dtype)
        out = self.call(container, "predictor", hidden, noised["timestep"], text)
        return as_tensor_output(out, "predictor")

    # ------------------------------------- the flow state (DistributionMatchingDistillation)
    #: The streams of the flow state: one, the latents.
    state_streams: tuple[str, ...] = ("latents",)

    def clean_state(self, conditions: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """The clean sample as the flow state: ``{"latents": [B, c, T, h, w]}``."""
        return {"latents": conditions["latents"]}

    def state_velocity(
        self, container: Any, role: str, state: Mapping[str, torch.Tensor], sigma: torch.Tensor,
        conditions: Mapping[str, Any],
    ) -> dict[str, torch.Tensor]:  # fmt: skip
        """The velocity of sub-model ``role`` at the noisy ``state`` and per-sample ``sigma`` ``[B]`` (CPU
        float32), through :meth:`predict` (the i2v channels; the nearest grid index, for expert routing)."""
        x_t = state["latents"]
        hidden = x_t
        if "image_condition" in conditions:
            hidden = torch.cat([x_t, conditions["image_condition"].to(x_t.dtype)], dim=1)
        nearest = (sigma.double()[:, None] - self.scheduler.sigmas64[None]).abs().argmin(dim=1)
        noised = {
            "indices": nearest,
            "hidden_states": hidden,
            "timestep": (sigma * self.scheduler.num_train_timesteps).to(x_t.device),
            "encoder_hidden_states": conditions["prompt_embeds"],
            "latent_shape": tuple(x_t.shape),
        }
        with self.acting_as(role):
            return {"latents": self.predict(container, noised)}

    def unconditional(
        self, container: Any, batch: Mapping[str, Any], conditions: Mapping[str, Any], negative_prompt: str
    ) -> dict[str, Any]:
        """``conditions`` with the unconditional text of classifier-free guidance: the batch's
        ``negative_prompt_embeds``, else ``negative_prompt`` through the text encoder."""
        if "negative_prompt_embeds" in batch:
            negative = batch["negative_prompt_embeds"]
        elif "prompt_embeds" in batch:
            raise KeyError(
                "guidance_scale != 1 (model.pipeline.distill or grpo) with pre-encoded prompts (prompt_embeds) "
                "needs the batch's negative_prompt_embeds too: the unconditional text of the guidance"
            )
        else:
            size = conditions["latents"].shape[0]
            negative = self.encode_prompt(container, {"prompt": [negative_prompt] * size})
        return {**conditions, "prompt_embeds": negative}

    # ---------------------------------------------------------------- 4. loss
    def compute_loss(self, prediction: torch.Tensor, noised: dict[str, Any]) -> torch.Tensor:
        """fp32 MSE per sample times the timestep weight, averaged over the batch.

        For ``ti2v`` the first latent frame (clean by construction) is excluded.
        """
        return self.per_sample_loss(prediction, noised).mean()

    def per_sample_loss(self, prediction: torch.Tensor, noised: dict[str, Any]) -> torch.Tensor:
        """``[B]``: each sample's fp32 MSE times its timestep weight (see :meth:`compute_loss`)."""
        target = noised["target"]
        if _is_packed(target):
            if len(prediction) != len(target) or any(p.shape != t.shape for p, t in zip(prediction, target)):
                raise ValueError(
                    f"packed predictor outputs {[tuple(p.shape) for p in prediction]} != targets "
                    f"{[tuple(t.shape) for t in target]}"
                )
            pairs = [(p.float(), t) for p, t in zip(prediction, target, strict=True)]
            if self.task == "ti2v":
                pairs = [_after_first_frame(p[None], t[None]) for p, t in pairs]
            mse = [(p - t).pow(2).mean() for p, t in pairs]
            return torch.stack(mse) * noised["weight"]
        if prediction.shape != target.shape:
            raise ValueError(
                f"predictor output shape {tuple(prediction.shape)} != target shape {tuple(target.shape)}"
            )
        pred = prediction.float()
        if self.task == "ti2v":
            pred, target = _after_first_frame(pred, target)
        per_sample = (pred - target).pow(2).flatten(1).mean(dim=1)
        return per_sample * noised["weight"]

    # ---------------------------------------------------------- validation
    @torch.no_grad()
    def validation_loss(
        self, container: Any, batch: Mapping[str, Any], rng: SampleRNG, num_timesteps: int
    ) -> torch.Tensor:
        """Per-sample loss ``[B]`` of held-out samples: the training loss at ``num_timesteps``
        fixed grid indices (:meth:`FlowMatchScheduler.spaced_indices` of the trained range), averaged.

        The noise comes from ``rng`` (purpose ``"noise"``, one draw per sample shared by every
        timestep): keyed by held-out sample index, it is the same at every validation and layout.
        """
        conditions = self.prepare_conditions(container, batch)
        size = conditions["latents"].shape[0]
        per_timestep = []
        for index in self.scheduler.spaced_indices(num_timesteps).tolist():
            noised = self.noising(conditions, rng, indices=torch.full((size,), index, dtype=torch.long))
            prediction = self.predict(container, noised)
            per_timestep.append(self.per_sample_loss(prediction, noised))
        return torch.stack(per_timestep).mean(dim=0)

    def metrics(self, container: Any, noised: dict[str, Any]) -> dict[str, float]:
        """``num_samples`` and ``num_tokens`` (predictor's count, else latent T*h*w per sample)."""
        counter = getattr(self.submodule(container, "predictor"), "tokens_per_sample", None)
        if isinstance(noised["latent_shape"], list):  # packed: one shape per sample
            shapes = noised["latent_shape"]
            tokens = sum(counter(shape) if callable(counter) else _prod(shape[1:]) for shape in shapes)
            return {"num_samples": float(len(shapes)), "num_tokens": float(tokens)}
        b, *sample_shape = noised["latent_shape"]
        per_sample = counter(tuple(sample_shape)) if callable(counter) else _prod(sample_shape[1:])
        return {"num_samples": float(b), "num_tokens": float(b * per_sample)}


def _is_packed(value: Any) -> bool:
    """A packed micro-batch holds per-sample tensors in a list (or tuple) instead of one stacked tensor."""
    return isinstance(value, (list, tuple))


def _after_first_frame(prediction: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, c, T, h, w]`` prediction and target without latent frame 0 (ti2v: the clean condition)."""
    if target.shape[2] < 2:
        raise ValueError("ti2v loss needs at least 2 latent frames (frame 0 is excluded)")
    return prediction[:, :, 1:], target[:, :, 1:]


def _require(batch: Mapping[str, Any], key: str, alternative: str) -> Any:
    if key not in batch:
        raise KeyError(f"batch needs {key!r} or {alternative!r}; it has keys {sorted(batch)}")
    return batch[key]


def _prod(values: list[int]) -> int:
    out = 1
    for v in values:
        out *= int(v)
    return out
