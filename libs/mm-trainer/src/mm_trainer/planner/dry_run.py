"""``--dry-run``: the FSDP plan of a config's model and its features, explained without allocating
weights, the process groups of its layout with the nodes each spans, and the full estimate of
``mm-train plan`` (one step traced on fake tensors: memory per rank by category, fit, step time)."""

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

from mm_trainer.model.container import ModelContainer, ModelContainerHub
from mm_trainer.model.features import feature_plans, plan_features
from mm_trainer.model.fsdp_plan import fsdp_plan_from_config
from mm_trainer.model.lora import inject_lora
from mm_trainer.planner.device_specs import device_spec
from mm_trainer.planner.report import render, summarize
from mm_trainer.planner.trace import trace_run
from mm_trainer.registry.plugins import import_plugins
from mm_trainer.tools.progress import SILENT, PhaseLog


def build_meta_model(config: TrainConfig) -> ModelContainer:
    """Every sub-model of ``config`` built on the meta device (no weights read, nothing allocated),
    with its LoRA adapters when it has ``lora``: the trainer's container build (mm_trainer.model.build)."""
    import_plugins(config.training.plugin)
    trainable = config.training.trainable_submodels or config.model.trainable_submodels()
    model = ModelContainerHub.build(config.model, device="meta", trainable=trainable, meta_init=True)
    inject_lora(model, {name: args.lora for name, args in config.model.sub_models().items()})
    return model


def dry_run(
    config: TrainConfig,
    *,
    world_size: int,
    ranks_per_node: int | None = None,
    device: str | None = None,
    progress: PhaseLog = SILENT,
) -> str:
    """The plan explanation table for ``world_size`` ranks, the compile / recompute / offload choices
    (``features``, applied as the trainer applies them before FSDP), the process groups of the
    layout and whether each stays inside a node of ``ranks_per_node`` ranks (None: as the config
    resolved it, ``$LOCAL_WORLD_SIZE`` under a launcher, else one node), then the full estimate of
    ``mm-train plan`` for ``device`` (memory per rank by category, fit, step time; None: left out).
    ``progress`` announces each phase and counts the trace's FSDP units (the planner's trace takes
    minutes at real size)."""
    progress("building the model on meta (container, LoRA)")
    model = build_meta_model(config)
    features = plan_features(model, **feature_plans(config.features)).lines() or ["none"]
    plan = fsdp_plan_from_config(config.parallel.fsdp_plan)
    p = config.parallel
    progress(f"explaining the FSDP plan at world size {world_size}")
    explanation = explain_fsdp_plan(model, plan, world_size, dp_replicate=int(p.replicate_parallel_size))
    nodes = NodeLayout(world_size, context_ranks_per_node({"ranks_per_node": ranks_per_node}, world_size))
    lines = [str(explanation), *(f"features: {line}" for line in features), "", describe_layout(p, nodes)]
    if device is not None:
        lines += [
            "",
            _full_estimate(
                config,
                world_size=world_size,
                device=device,
                ranks_per_node=nodes.ranks_per_node,
                progress=progress,
            ),
        ]
    return "\n".join(lines)


def _full_estimate(
    config: TrainConfig, *, world_size: int, device: str, ranks_per_node: int, progress: PhaseLog
) -> str:
    """``mm-train plan``'s table for ``device``; for a model that does not describe a batch of its
    real shapes (no ``planning_batch``), a line that says so and why instead of the table: the
    rest of the dry run (plan, features, layout) holds without it, ``mm-train plan`` still refuses."""
    try:
        run = trace_run(
            config,
            world_size=world_size,
            device=device_spec(device),
            ranks_per_node=ranks_per_node,
            progress=progress,
        )
    except NotImplementedError as missing:
        return f"full estimate: not available for this model ({missing})"
    progress("summarizing the trace: memory by category, fit, step time")
    return render(summarize(run), run, header=f"full estimate (mm-train plan --device {device}):")


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
