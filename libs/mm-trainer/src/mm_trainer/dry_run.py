"""``--dry-run``: the FSDP plan of a config's model and its features, explained without allocating weights."""

from __future__ import annotations

from mm_config import TrainConfig
from mm_parallel import FSDPPlan, explain_fsdp_plan

from mm_trainer.container import ModelContainer, container_class, freeze
from mm_trainer.features import feature_plans, plan_features
from mm_trainer.lora import inject_lora
from mm_trainer.model_hub import ModelHub
from mm_trainer.plugins import import_plugins


def build_meta_model(config: TrainConfig) -> ModelContainer:
    """Every sub-model of ``config`` built on the meta device (no weights read, nothing allocated),
    with its LoRA adapters when it has ``lora``."""
    import_plugins(config.training.plugin)
    trainable = config.training.trainable_submodels or config.model.trainable_submodels()
    sub_models = {}
    for name, args in config.model.sub_models().items():
        module = ModelHub.build(args, meta_init=True)
        if name not in trainable:
            freeze(module)
        sub_models[name] = module
    model = container_class(config.model)(sub_models, trainable=tuple(trainable), pipeline=None)
    inject_lora(model, {name: args.lora for name, args in config.model.sub_models().items()})
    return model


def dry_run(config: TrainConfig, *, world_size: int) -> str:
    """The plan explanation table for ``world_size`` ranks, then the compile / recompute / offload
    choices (``features``), applied as the trainer applies them before FSDP."""
    model = build_meta_model(config)
    features = plan_features(model, **feature_plans(config.features)).lines() or ["none"]
    plan = FSDPPlan.from_dict(config.parallel.fsdp_plan.model_dump())
    table = str(explain_fsdp_plan(model, plan, world_size))
    return "\n".join([table, *(f"features: {line}" for line in features)])
