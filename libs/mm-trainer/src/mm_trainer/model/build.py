"""The build steps of a run, shared by :class:`mm_trainer.Trainer` and the planner (``mm-train plan``).

One code path builds the model a run trains and the model ``plan`` traces (docs/DESIGN.md "Build
order"): the container (``ModelContainerHub``), LoRA adapters, context-parallel hooks, features and
the FSDP plan (:func:`build_sharded_model`), materialization (:func:`materialize`), the EMA
(:func:`build_ema`) and the optimizer with its LR schedule (:func:`build_optimization`). The
trainer then loads weights into what :func:`materialize` allocated; the planner runs the same
functions under a fake process group and ``FakeTensorMode``, so nothing is read or allocated.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from mm_checkpoint import materialize_meta
from mm_config import TrainConfig
from mm_parallel import FSDPPlanReport, ParallelState, UlyssesOverlap, apply_fsdp_plan
from torch import nn

from mm_trainer.model.container import ModelContainer, ModelContainerHub
from mm_trainer.model.ema import ParameterEMA
from mm_trainer.model.features import FeaturesReport, apply_features, feature_plans
from mm_trainer.model.fsdp_plan import fsdp_plan_from_config
from mm_trainer.model.lora import LoraAdapters, inject_lora
from mm_trainer.model.optim import build_lr_scheduler, build_optimizer

logger = logging.getLogger("mm_trainer")
Log = Callable[[str], None]


def log_rank0(message: str) -> None:
    """Log ``message`` on rank 0 only (every rank when no process group exists)."""
    if not dist.is_initialized() or dist.get_rank() == 0:
        logger.warning(message)


def parallel_state_for(
    config: TrainConfig, world_size: int, device_type: str, *, timeouts: bool = True
) -> ParallelState:
    """The run's :class:`ParallelState` from the resolved ``parallel`` section (meshes when a process
    group exists: every rank must call this at the same point). Without ``timeouts`` the groups keep
    their backend's (the planner's fake groups have none to set)."""
    parallel = config.parallel
    overlap = parallel.ulysses_overlap
    return ParallelState(
        world_size=world_size,
        dp_replicate=parallel.replicate_parallel_size,
        ulysses=parallel.ulysses_parallel_size,
        ring=parallel.ring_attention_size,
        device_type=device_type,
        timeout_s=config.training.collective_timeout_s if timeouts else None,
        ulysses_overlap=UlyssesOverlap(  # "auto" = the device's measured default
            heads=None if overlap.head_groups == "auto" else int(overlap.head_groups),
            projections=None if overlap.projections == "auto" else overlap.projections,
        ),
    )


@dataclass
class ShardedModel:
    """What :func:`build_sharded_model` built: the container (sharded, parameters still where the
    build left them: meta for ``meta_init`` sub-models), its LoRA adapters and the feature and FSDP
    reports."""

    model: ModelContainer
    lora: LoraAdapters
    features: FeaturesReport
    fsdp: FSDPPlanReport


def build_sharded_model(
    config: TrainConfig,
    parallel_state: ParallelState,
    device: torch.device,
    *,
    model_section: Any = None,
    meta_init: bool | None = None,
    compile_modules: bool = True,
    log: Log = log_rank0,
) -> ShardedModel:
    """Container -> LoRA -> context parallel -> features -> FSDP plan (docs/DESIGN.md "Build order").

    ``model_section`` replaces ``config.model`` (the trainer's staged copy, ``training.stage_dir``);
    ``meta_init=True`` builds every sub-model on meta (the planner: no weights read); without
    ``compile_modules`` the compile plan is left out (the planner traces eager forwards).
    """
    trainable = config.training.trainable_submodels or config.model.trainable_submodels()
    section = config.model if model_section is None else model_section
    model = ModelContainerHub.build(section, device=device, trainable=trainable, meta_init=meta_init)
    micro_steps = config.features.condition_micro_steps
    if micro_steps > 1 and not model.encodes_conditions:
        raise ValueError(
            f"features.condition_micro_steps={micro_steps} needs a pipeline that encodes conditions "
            f"separately (prepare_conditions + train_on_conditions, mm_pipelines.GenerativePipelineBase); "
            f"{type(model).__name__} has pipeline {type(model.pipeline).__name__}. Set it to 1"
        )
    lora = inject_lora(model, {name: sub.lora for name, sub in config.model.sub_models().items()})
    if parallel_state.cp_enabled:
        setup_context_parallel(model, parallel_state)
    plans = feature_plans(config.features)
    if not compile_modules:
        plans["compile_modules"] = []
    features = apply_features(model, **plans)
    for line in features.lines():
        log(f"features: {line}")
    fsdp = apply_fsdp_plan(model, fsdp_plan_from_config(config.parallel.fsdp_plan), parallel_state)
    for source, target in fsdp.cross_submodel_prefetch.items():
        log(f"cross-sub-model prefetch: {source} gathers {target} (from step 2)")
    return ShardedModel(model, lora, features, fsdp)


def build_meta_container(config: TrainConfig) -> ModelContainer:
    """The run's container with every sub-model on the meta device (configs read, no weight): what the
    checks that run before the build ask (a sample's tokens, a LoRA file's layers)."""
    trainable = config.training.trainable_submodels or config.model.trainable_submodels()
    return ModelContainerHub.build(config.model, device="cpu", trainable=trainable, meta_init=True)


def setup_context_parallel(model: ModelContainer, parallel_state: ParallelState) -> None:
    """Let every sub-model that supports context parallelism install it (plugin contract)."""
    enabled = [n for n, m in model.sub_models().items() if hasattr(m, "setup_context_parallel")]
    if not enabled:
        raise ValueError(
            "parallel: ulysses_parallel_size x ring_attention_size > 1 but no sub-model defines "
            "setup_context_parallel(parallel_state)"
        )
    for name in enabled:
        getattr(model, name).setup_context_parallel(parallel_state)


def materialize(name: str, module: nn.Module, device: torch.device) -> None:
    """Allocate a meta-built sub-model on ``device`` (tied weights stay tied). Non-persistent buffers
    are in no checkpoint: the module must rebuild them in ``init_non_persistent_buffers()``."""
    lost = materialize_meta(module, device)
    rebuild = getattr(module, "init_non_persistent_buffers", None)
    if callable(rebuild):
        rebuild()
    elif lost:
        raise ValueError(
            f"model.models.{name}: meta_init leaves non-persistent buffers {lost} uninitialized and "
            f"{type(module).__name__} has no init_non_persistent_buffers(); set meta_init: false or add it"
        )


def build_ema(model: nn.Module, training: Any) -> ParameterEMA | None:
    """``training.ema``: the EMA of the trainable parameters on their shards, or None."""
    return ParameterEMA(model, decay=training.ema.decay) if training.ema is not None else None


def build_optimization(
    model: nn.Module, training: Any, device_type: str
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over the trainable parameters (fused on accelerators) and its LR schedule, from ``training``."""
    optimizer = build_optimizer(
        model,
        lr=training.lr,
        betas=(training.adam_beta1, training.adam_beta2),
        eps=training.adam_eps,
        weight_decay=training.weight_decay,
        device_type=device_type,
    )
    scheduler = build_lr_scheduler(
        optimizer,
        kind=training.lr_scheduler,
        warmup=training.lr_warmup_iters,
        total=training.train_iters,
        lr=training.lr,
        min_lr=training.min_lr,
    )
    return optimizer, scheduler
