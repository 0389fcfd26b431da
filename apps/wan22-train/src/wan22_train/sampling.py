"""``wan22-train sample``: generate a clip with a trained predictor (Euler flow-match sampling)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from mm_checkpoint import DistributedCheckpointer
from mm_config import TrainConfig
from mm_data import write_video
from mm_pipelines import FlowMatchScheduler, masked_text_embeddings
from mm_trainer import ModelContainer, ModelHub, freeze, import_plugins, inject_lora

from wan22_train.distill import CRITIC, TEACHER, distillation_pipeline
from wan22_train.experts import boundary_timestep
from wan22_train.pipeline import LOW_NOISE_ROLE, Wan22Pipeline
from wan22_train.predictor import WanPredictor
from wan22_train.text_encoder import UMT5TextEncoder
from wan22_train.vae import WanVideoVAE

PREDICTOR = "predictor"
#: Sub-models of a distillation run that sampling leaves out (:mod:`wan22_train.distill`).
DISTILLATION_ONLY = (TEACHER, CRITIC, f"{TEACHER}_low", f"{CRITIC}_low")


def load_for_sampling(config: TrainConfig, checkpoint: str | Path) -> dict[str, Any]:
    """The VAE, text encoder (from their sources) and the predictor(s) restored from ``checkpoint``.

    A run with ``expert: both`` restores ``predictor_low`` too, and ``boundary_timestep`` (the
    timestep below which it takes over) comes with the modules. A LoRA predictor (``lora`` in its
    section) loads its base from its source and its adapters from the checkpoint.
    """
    import_plugins(config.training.plugin)
    subs = config.model.sub_models()
    trained = tuple(name for name in (PREDICTOR, LOW_NOISE_ROLE) if name in subs)
    modules: dict[str, Any] = {}
    for name, args in subs.items():
        if name in DISTILLATION_ONLY:  # a distillation's teacher and critic: the student samples alone
            continue
        if name in trained:
            module = WanPredictor.from_pretrained(args) if args.lora else WanPredictor.build_from_config(args)
        else:
            module = ModelHub.build(args, meta_init=False)
        freeze(module)
        modules[name] = module
    holder = ModelContainer({name: modules[name] for name in trained}, trainable=trained)
    inject_lora(holder, {name: subs[name].lora for name in trained})
    DistributedCheckpointer(checkpoint).load({"model": holder})
    if LOW_NOISE_ROLE in trained:
        options = config.model.pipeline or {}
        if options.get("expert") != "both":
            raise ValueError(f"the config has {LOW_NOISE_ROLE!r} but model.pipeline.expert is not 'both'")
        modules["boundary_timestep"] = boundary_timestep(options)
    return modules


@torch.no_grad()
def sample_video(
    modules: dict[str, Any],
    prompt: str,
    *,
    num_frames: int,
    height: int,
    width: int,
    steps: int = 20,
    shift: float = 5.0,
    guidance: float = 1.0,
    negative_prompt: str = "",
    seed: int = 0,
    device: torch.device | str = "cpu",
    sigmas: torch.Tensor | None = None,
) -> torch.Tensor:
    """Video [3, F, H, W] in [-1, 1] for ``prompt`` (classifier-free guidance when ``guidance`` != 1):
    Euler steps on ``steps`` sigmas at ``shift`` (the scheduler's default grid), or on explicit ``sigmas``
    (decreasing, ending in 0: a distilled student's own schedule), from ``sigmas[0]`` times the noise.

    With both A14B experts (``predictor_low`` and ``boundary_timestep`` in ``modules``) the
    high-noise ``predictor`` runs while ``t >= boundary_timestep`` and ``predictor_low`` after.
    The starting noise is drawn on the CPU from ``seed`` alone (the same clip on any device count
    or layout), then moved to ``device``, where the modules are.
    """
    vae: WanVideoVAE = modules["ae"]
    text_encoder: UMT5TextEncoder = modules["text_encoder"]
    t, s = vae.temporal_compression, vae.spatial_compression
    if (num_frames - 1) % t or height % s or width % s:
        raise ValueError(
            f"frames-1 must divide by {t} and height/width by {s}; got {num_frames}x{height}x{width}"
        )
    shape = (1, vae.vae.config.z_dim, 1 + (num_frames - 1) // t, height // s, width // s)
    scheduler = FlowMatchScheduler(shift=shift)
    if sigmas is None:
        timesteps = scheduler.set_inference_timesteps(steps)
        assert scheduler.inference_sigmas is not None
        sigmas = scheduler.inference_sigmas
    else:  # as a distillation's student is called in training (DistributionMatchingDistillation.velocity)
        sigmas = sigmas.float().cpu()
        timesteps = sigmas[:-1] * scheduler.num_train_timesteps
    noise = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    latents = (noise * sigmas[0]).to(device)
    cond = _encode_text(text_encoder, [prompt], device)
    uncond = _encode_text(text_encoder, [negative_prompt], device) if guidance != 1.0 else None
    for i, timestep in enumerate(timesteps):
        t_batch = timestep.reshape(1).to(device)
        predictor = expert_for(modules, float(timestep))
        v = predictor(latents, t_batch, cond)
        if uncond is not None:
            v_uncond = predictor(latents, t_batch, uncond)
            v = v_uncond + guidance * (v - v_uncond)
        latents = scheduler.step(v, sigmas[i], sigmas[i + 1], latents)
    return vae.decode(latents)[0]


def student_sigmas(config: TrainConfig, steps: int, shift: float | None = None) -> torch.Tensor | None:
    """A distillation run's student schedule for ``steps`` Euler steps (its grid, ``student_shift`` unless
    ``shift`` is given, ``student_sigma_max``): what ``sample`` draws a distilled checkpoint on, exactly
    the sigmas it trained on. None for a run without ``model.pipeline.distill``."""
    options = dict(config.model.pipeline or {})
    distill = options.pop("distill", None)
    if distill is None:
        return None
    distill = {**distill, **({} if shift is None else {"student_shift": shift})}
    return distillation_pipeline(Wan22Pipeline.from_options(options), distill).student_sigmas(steps)


def expert_for(modules: dict[str, Any], timestep: float) -> WanPredictor:
    """The predictor that denoises at ``timestep``: the low-noise expert below the boundary, if any."""
    boundary = modules.get("boundary_timestep")
    if boundary is not None and timestep < boundary:
        return modules[LOW_NOISE_ROLE]
    return modules[PREDICTOR]


def _encode_text(
    text_encoder: UMT5TextEncoder, prompts: list[str], device: torch.device | str
) -> torch.Tensor:
    tokens = text_encoder.tokenize(prompts, device)
    out = text_encoder(**tokens).last_hidden_state
    return masked_text_embeddings(out, tokens["attention_mask"])


__all__ = ["expert_for", "load_for_sampling", "sample_video", "student_sigmas", "write_video"]
