"""``--dry-run``: the FSDP plan of a config's model and its features, explained without allocating
weights, and the process groups of its layout with the nodes each spans."""

from __future__ import annotations

from mm_config import ParallelConfig, TrainConfig, context_ranks_per_node
from mm_parallel import (
    GROUP_ROLES,
    NodeLayout,
    ParallelState,
    describe_node_layout,
    explain_fsdp_plan,
    sub_plan_rank_groups,
)

from mm_trainer.container import ModelContainer, container_class, freeze
from mm_trainer.features import feature_plans, plan_features
from mm_trainer.fsdp_plan_config import fsdp_plan_from_config
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


def dry_run(config: TrainConfig, *, world_size: int, ranks_per_node: int | None = None) -> str:
    """The plan explanation table for ``world_size`` ranks, the compile / recompute / offload choices
    (``features``, applied as the trainer applies them before FSDP), then the process groups of the
    layout and whether each stays inside a node of ``ranks_per_node`` ranks (None: as the config
    resolved it, ``$LOCAL_WORLD_SIZE`` under a launcher, else one node)."""
    model = build_meta_model(config)
    features = plan_features(model, **feature_plans(config.features)).lines() or ["none"]
    plan = fsdp_plan_from_config(config.parallel.fsdp_plan)
    p = config.parallel
    explanation = explain_fsdp_plan(model, plan, world_size, dp_replicate=int(p.replicate_parallel_size))
    nodes = NodeLayout(world_size, context_ranks_per_node({"ranks_per_node": ranks_per_node}, world_size))
    lines = [str(explanation), *(f"features: {line}" for line in features)]
    return "\n".join(lines) + f"\n\n{describe_layout(p, nodes)}"


def describe_layout(parallel: ParallelConfig, nodes: NodeLayout) -> str:
    """The groups of a resolved ``parallel`` section (mesh and sub-plans) and the nodes each spans."""
    state = ParallelState(
        world_size=nodes.world_size,
        dp_replicate=int(parallel.replicate_parallel_size),
        ulysses=parallel.ulysses_parallel_size,
        ring=parallel.ring_attention_size,
        device_type="cpu",
    )
    groups = state.rank_groups()
    roles = dict(GROUP_ROLES)
    for name, sub in parallel.fsdp_plan.sub_plans.items():
        if sub.enabled and sub.shard_size is not None:
            for kind, members in sub_plan_rank_groups(nodes.world_size, sub.shard_size).items():
                groups[f"{name} {kind}"] = members
                roles[f"{name} {kind}"] = f"sub-plan {kind} group of {name}"
    return describe_node_layout(groups, nodes, roles)
