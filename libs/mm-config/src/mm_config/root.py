"""``TrainConfig``: the six sections and the rules that tie them together.

Cross-section rules live in one ``model_validator(mode="after")``; it also resolves the derived
values (``replicate_parallel_size`` / ``fully_shard_parallel_size: auto``, ``global_batch_size`` or
``gradient_accumulation_steps``, ``trainable_submodels``) for the world size given in the validation
context (``{"world_size": n}``), else ``$WORLD_SIZE``, else 1, and the ranks per node given there
(``{"ranks_per_node": m}``), else ``$LOCAL_WORLD_SIZE``, else the world size (one node).
Each rule names the keys it read (``deps``) so that a report can leave out consequences of
another error.
"""

from __future__ import annotations

import math
import os

from pydantic import Field, ValidationInfo, model_validator

from .base import ConfigModel, pattern_head
from .data import DataConfig
from .errors import Loc, Problem, RuleViolations, suggest
from .features import FeaturesConfig
from .model import ModelConfig
from .parallel import ParallelConfig
from .registry import dataset_schema, pipeline_schema
from .tools import ToolsConfig
from .training import TrainingConfig

_HEAD_KEYS = ("num_heads", "num_attention_heads")
_ULYSSES: Loc = ("parallel", "ulysses_parallel_size")
_RING: Loc = ("parallel", "ring_attention_size")
_DP: Loc = ("parallel", "replicate_parallel_size")
_SHARD: Loc = ("parallel", "fully_shard_parallel_size")
_KERNEL: Loc = ("parallel", "attention_backend")
_OVERLAP: Loc = ("parallel", "ulysses_overlap")


class TrainConfig(ConfigModel):
    """A complete, validated training config (the six YAML sections)."""

    parallel: ParallelConfig = Field(default_factory=ParallelConfig)
    """Process layout and FSDP2 plan."""
    model: ModelConfig = Field(default_factory=ModelConfig)
    """What to build and load."""
    data: DataConfig = Field(default_factory=DataConfig)
    """What to read."""
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    """How to train."""
    tools: ToolsConfig = Field(default_factory=ToolsConfig)
    """Profilers."""
    features: FeaturesConfig = Field(default_factory=FeaturesConfig)
    """Memory/throughput features."""

    @model_validator(mode="after")
    def _cross_section_rules(self, info: ValidationInfo) -> TrainConfig:
        world = context_world_size(info.context)
        p = self.parallel
        if p.replicate_parallel_size == "auto" and p.fully_shard_parallel_size != "auto":
            p.replicate_parallel_size = max(
                1, world // int(p.fully_shard_parallel_size)
            )  # the shard degree decides
        elif p.replicate_parallel_size == "auto":
            p.replicate_parallel_size = replicas_across_nodes(
                world, context_ranks_per_node(info.context, world), p.cp_size
            )
        problems = _layout_problems(self.parallel, world)
        problems += _submodel_problems(self)
        problems += _packing_problems(self)
        problems += _reward_problems(self)
        problems += _guidance_problems(self)
        problems += _rollout_cadence_problems(self)
        if not problems:
            problems += _batch_and_heads_problems(self, world)
        if problems:
            raise RuleViolations(problems)
        self._resolve(world)
        return self

    def _resolve(self, world: int) -> None:
        p, t = self.parallel, self.training
        p.fully_shard_parallel_size = world // p.replicate_parallel_size
        dp = world // p.cp_size
        if t.gradient_accumulation_steps is None:  # Megatron's convention: derived from the global batch
            per_step = t.micro_batch_size * dp
            t.gradient_accumulation_steps = t.global_batch_size // per_step if t.global_batch_size else 1
        t.global_batch_size = t.micro_batch_size * t.gradient_accumulation_steps * dp
        if t.trainable_submodels is None:
            t.trainable_submodels = self.model.trainable_submodels()


def context_world_size(context: object) -> int:
    """World size from a validation context dict, else ``$WORLD_SIZE``, else 1."""
    value = context.get("world_size") if isinstance(context, dict) else None
    if value is None:
        value = os.environ.get("WORLD_SIZE", 1)
    world = int(value)
    if world < 1:
        raise ValueError(f"world size must be >= 1, got {world}")
    return world


def context_ranks_per_node(context: object, world: int) -> int:
    """Ranks per node from a validation context dict, else ``$LOCAL_WORLD_SIZE`` where ``world`` is the
    launcher's ``$WORLD_SIZE`` (torchrun sets both), else ``world`` (one node)."""
    value = context.get("ranks_per_node") if isinstance(context, dict) else None
    if value is None:
        launched = os.environ.get("WORLD_SIZE") == str(world)
        value = os.environ.get("LOCAL_WORLD_SIZE", world) if launched else world
    per_node = int(value)
    if per_node < 1 or world % per_node:
        raise ValueError(
            f"{per_node} ranks per node do not divide the world size {world}: every node must run the "
            "same number of ranks (torchrun --nproc-per-node)"
        )
    return per_node


def replicas_across_nodes(world: int, ranks_per_node: int, cp: int) -> int:
    """``replicate_parallel_size: auto``: one HSDP replica per group of nodes just large enough to hold whole
    context-parallel groups, ``world / lcm(ranks_per_node, cp)`` (1 where ``cp`` does not divide the
    world: that is reported as the error it is)."""
    group = math.lcm(ranks_per_node, cp)
    return world // group if world % group == 0 else 1


def _layout_problems(p: ParallelConfig, world: int) -> list[Problem]:
    out: list[Problem] = []
    cp, dp = p.cp_size, p.replicate_parallel_size
    if world % cp:
        at, other = (_RING, _ULYSSES) if p.ulysses_parallel_size == 1 else (_ULYSSES, _RING)
        out.append(
            Problem(
                at,
                f"ulysses_parallel_size ({p.ulysses_parallel_size}) x ring_attention_size "
                f"({p.ring_attention_size}) = {cp} must divide the world size {world} "
                f"({world} % {cp} = {world % cp})",
                p.ulysses_parallel_size if at == _ULYSSES else p.ring_attention_size,
                deps=(other,),
            )
        )
    if world % dp:
        out.append(Problem(_DP, f"must divide the world size {world} ({world} % {dp} = {world % dp})", dp))
    shard = p.fully_shard_parallel_size
    if not out and shard != "auto" and dp * shard != world:
        out.append(
            Problem(
                _SHARD,
                f"replicate_parallel_size ({dp}) x fully_shard_parallel_size ({shard}) = "
                f"{dp * shard}, expected the world size {world} (or 'auto' = {world // dp})",
                shard,
                deps=(_DP,),
            )
        )
    elif not out and (world // dp) % cp:
        out.append(
            Problem(
                _SHARD,
                f"FSDP shard group {world // dp} (world {world} / replicate_parallel_size {dp}) "
                f"must be a multiple of ulysses x ring = {cp}: context-parallel ranks belong to "
                "the shard group",
                shard,
                deps=(_DP, _ULYSSES, _RING),
            )
        )
    if p.attention_backend != "auto" and p.ring_attention_size == 1:
        out.append(
            Problem(
                _KERNEL,
                "selects the ring-attention block kernel, and ring_attention_size is 1 (Ulysses-only attention "
                "runs torch SDPA, which picks its fused kernel itself); expected auto",
                p.attention_backend,
                deps=(_RING,),
            )
        )
    if p.ulysses_overlap.chosen and p.ulysses_parallel_size == 1:
        out.append(
            Problem(
                _OVERLAP,
                "overlaps the Ulysses all-to-all, and ulysses_parallel_size is 1 (nothing to overlap); expected "
                "auto or off",
                p.ulysses_overlap.model_dump(),
                deps=(_ULYSSES,),
            )
        )
    for name, sub in p.fsdp_plan.sub_plans.items():
        if sub.shard_size is not None and world % sub.shard_size:
            out.append(
                Problem(
                    ("parallel", "fsdp_plan", "sub_plans", name, "shard_size"),
                    f"must divide the world size {world} ({world} % {sub.shard_size} = "
                    f"{world % sub.shard_size})",
                    sub.shard_size,
                )
            )
    return out


def _submodel_problems(cfg: TrainConfig) -> list[Problem]:
    subs = cfg.model.sub_models()
    model_deps: tuple[Loc, ...] = (("model", "models"), ("model", "model_id"), ("model", "freeze"))
    out: list[Problem] = []
    for i, name in enumerate(cfg.training.trainable_submodels or []):
        loc: Loc = ("training", "trainable_submodels", i)
        if name not in subs:
            out.append(
                Problem(loc, f"not a sub-model; {suggest(name, subs, 'sub-model')}", name, deps=model_deps)
            )
        elif subs[name].freeze:
            where = f"model.models.{name}" if cfg.model.is_container else "model"
            out.append(
                Problem(
                    loc,
                    f"sub-model `{name}` is frozen ({where}.freeze: true) and cannot be trained",
                    name,
                    deps=model_deps,
                )
            )
    out += _lora_problems(cfg)
    out += _phase_problems(cfg)
    out += _dtype_problems(cfg)
    for name in cfg.parallel.fsdp_plan.sub_plans:
        if name not in subs:
            out.append(
                Problem(
                    ("parallel", "fsdp_plan", "sub_plans", name),
                    f"not a sub-model; {suggest(name, subs, 'sub-model')}",
                    deps=model_deps,
                )
            )
    order = cfg.parallel.fsdp_plan.cross_submodel_prefetch
    for i, name in enumerate(order):
        if name not in subs:
            loc = ("parallel", "fsdp_plan", "cross_submodel_prefetch", i)
            out.append(
                Problem(loc, f"not a sub-model; {suggest(name, subs, 'sub-model')}", name, deps=model_deps)
            )
    if cfg.model.is_container:
        out += _pattern_head_problems(cfg, set(subs))
    return out


def _phase_problems(cfg: TrainConfig) -> list[Problem]:
    """``training.phases``: each phase names trainable sub-models, every trainable sub-model is in exactly
    one phase, and conditions are encoded in the step (a phase is passed with each micro-batch)."""
    phases = cfg.training.phases
    if not phases:
        return []
    trainable = cfg.training.trainable_submodels or cfg.model.trainable_submodels()
    deps: tuple[Loc, ...] = (("training", "trainable_submodels"), ("model", "models"))
    out: list[Problem] = []
    owner: dict[str, str] = {}
    for phase, section in phases.items():
        for i, name in enumerate(section.submodels):
            loc: Loc = ("training", "phases", phase, "submodels", i)
            if name not in trainable:
                out.append(
                    Problem(
                        loc, f"not a trainable sub-model; trainable: {sorted(trainable)}", name, deps=deps
                    )
                )
            elif name in owner:
                out.append(Problem(loc, f"already trained by phase `{owner[name]}`", name))
            owner.setdefault(name, phase)
    if all(section.every > 1 for section in phases.values()):
        out.append(
            Problem(("training", "phases"), "needs a phase with every: 1 (each optimizer step updates one)")
        )
    left = [name for name in trainable if name not in owner]
    if left:
        out.append(
            Problem(("training", "phases"), f"the trainable sub-models {left} belong to no phase", deps=deps)
        )
    if cfg.features.condition_micro_steps > 1:
        out.append(
            Problem(
                ("features", "condition_micro_steps"),
                "must be 1 with training.phases (each phase's forward encodes its own conditions)",
                cfg.features.condition_micro_steps,
                deps=(("training", "phases"),),
            )
        )
    return out


REWARD_MODES = ("grpo", "nft")
"""The ``model.pipeline`` keys of the reward fine-tunings that train on their rollouts' rewards (Flow-GRPO,
DiffusionNFT)."""


def _reward_problems(cfg: TrainConfig) -> list[Problem]:
    """``training.rewards`` score something: validation's clips or a reward fine-tuning's rollouts
    (``model.pipeline.grpo`` / ``nft``), which needs them."""
    rewards, validation = cfg.training.rewards, cfg.training.validation
    pipeline = cfg.model.pipeline if isinstance(cfg.model.pipeline, dict) else {}
    modes = [mode for mode in REWARD_MODES if pipeline.get(mode) is not None]
    if rewards and not modes and not (validation is not None and validation.prompts):
        return [
            Problem(
                ("training", "rewards"),
                "scores the clips that training.validation samples, or the rollouts of model.pipeline.grpo "
                "or model.pipeline.nft: set training.validation.prompts",
                deps=(("training", "validation"),),
            )
        ]
    if modes and not rewards:
        return [
            Problem(
                ("model", "pipeline", modes[0]),
                "trains the policy on its rollouts' rewards, and training.rewards lists none: add one (e.g. "
                "{id: colour_target, options: {target: [1, 0, 0]}})",
                deps=(("training", "rewards"),),
            )
        ]
    return []


def _guidance_problems(cfg: TrainConfig) -> list[Problem]:
    """Classifier-free guidance of a distillation's teacher or of GRPO's rollouts needs the negative prompt's
    embeddings, which a dataset of pre-encoded prompts (its schema's ``gives_prompt_embeds``) does not give."""
    pipeline = cfg.model.pipeline if isinstance(cfg.model.pipeline, dict) else {}
    schema = dataset_schema(cfg.data.dataset_id) if cfg.data.dataset_id else None
    if not getattr(schema, "gives_prompt_embeds", False):
        return []
    return [
        Problem(
            ("model", "pipeline", mode, "guidance_scale"),
            f"needs the negative prompt's embeddings, and data.dataset_id `{cfg.data.dataset_id}` gives pre-encoded "
            "prompts without them: train on the videos and captions, or set guidance_scale: 1",
            pipeline[mode]["guidance_scale"],
            deps=(("data", "dataset_id"),),
        )
        for mode in ("distill", "grpo")
        if isinstance(pipeline.get(mode), dict) and pipeline[mode].get("guidance_scale", 1.0) != 1.0
    ]


def _rollout_cadence_problems(cfg: TrainConfig) -> list[Problem]:
    """With ``model.pipeline.grpo.updates_per_rollout`` > 1 the rollouts between rollout steps live in memory
    only: every resumable save (``training.save_interval``, the end at ``training.train_iters``) must fall on
    a rollout step."""
    grpo = cfg.model.pipeline.get("grpo") if isinstance(cfg.model.pipeline, dict) else None
    updates = grpo.get("updates_per_rollout", 1) if isinstance(grpo, dict) else 1
    if not isinstance(updates, int) or updates <= 1:  # a wrong type: the pipeline schema's error
        return []
    training = cfg.training
    problems = []
    for key, value in (("save_interval", training.save_interval), ("train_iters", training.train_iters)):
        if value and value % updates:
            problems.append(
                Problem(
                    ("training", key),
                    f"must be a multiple of model.pipeline.grpo.updates_per_rollout={updates} (a Flow-GRPO run "
                    "resumes only at a rollout step: the rollouts in between are not saved)",
                    value,
                    deps=(("model", "pipeline", "grpo", "updates_per_rollout"),),
                )
            )
    return problems


def _packing_problems(cfg: TrainConfig) -> list[Problem]:
    """What packed micro-batches (``data.packing``) cannot run with yet."""
    if cfg.data.packing is None:
        return []
    deps = (("data", "packing"),)
    out = []
    if cfg.features.condition_micro_steps > 1:
        out.append(
            Problem(
                ("features", "condition_micro_steps"),
                "must be 1 with data.packing (conditions encoded ahead are stacked per micro-batch)",
                cfg.features.condition_micro_steps,
                deps=deps,
            )
        )
    if cfg.training.phases:
        out.append(
            Problem(
                ("training", "phases"),
                "cannot run with data.packing: the phased pipelines (DMD2 distillation, Diffusion-DPO) work on "
                "stacked micro-batches of one shape (the student's rollout and re-noising of the batch, the "
                "teacher's guided and the critic's velocities on it, DPO's preferred / rejected pairs) and have "
                "no per-sample packed path; train them with buckets (remove data.packing)",
                sorted(cfg.training.phases),
                deps=deps,
            )
        )
    return out


def _dtype_problems(cfg: TrainConfig) -> list[Problem]:
    """Dtypes that cannot run together when ``parallel.fsdp_plan.param_dtype`` is unset.

    FSDP2 casts a unit's forward inputs only to ``param_dtype`` (with ``cast_forward_inputs``); unset, every
    unit computes in the dtype its sub-model is stored in and nothing converts the activations passed
    between units or sub-models. So, without ``param_dtype``:

    - ``output_dtype`` other than the stored dtype, with more than one unit (units inside a sub-model, or
      several wrapped sub-models), hands the next unit activations it cannot multiply with its weights
      (a dtype mismatch at the first forward); equal to the stored dtypes it casts nothing;
    - the sub-models the plan wraps (not ``ignored_modules``, not ``enabled: false``) must share one
      stored ``dtype``: a bf16 text encoder feeds an fp32 predictor bf16 activations (the same mismatch),
      unless the pipeline casts its models' inputs itself (its schema's ``input_dtype_key`` option, e.g.
      Wan's ``predict_dtype``, is set).
    """
    plan = cfg.parallel.fsdp_plan
    if plan.param_dtype is not None:
        return []
    ignored = set(plan.ignored_modules)
    wrapped = {
        name: sub.dtype or "fp32"
        for name, sub in cfg.model.sub_models().items()
        if name not in ignored and (name not in plan.sub_plans or plan.sub_plans[name].enabled)
    }
    param_deps: tuple[Loc, ...] = (("parallel", "fsdp_plan", "param_dtype"),)
    out: list[Problem] = []
    output = plan.output_dtype
    several_units = bool(plan.apply_modules) or len(wrapped) > 1
    if output is not None and several_units:
        others = {n: d for n, d in wrapped.items() if d != output}
        reason = (
            f"FSDP casts each unit's outputs to {output} but, with param_dtype unset, casts no unit's inputs: the "
            f"next unit computes in its stored dtype ({', '.join(f'{n} {d}' for n, d in others.items())}) and gets "
            f"{output} activations, a dtype mismatch at the first forward"
            if others
            else f"with param_dtype unset every unit computes in {output} already: casting its outputs to {output} "
            "does nothing"
        )
        out.append(
            Problem(
                ("parallel", "fsdp_plan", "output_dtype"),
                f"{reason}; set param_dtype (the dtype every unit computes in and casts its inputs to), or leave "
                "output_dtype out",
                output,
                deps=param_deps,
            )
        )
    if len(set(wrapped.values())) > 1 and not _pipeline_casts_inputs(cfg):
        # the most common dtype (on a tie the default) is the run's; the sub-models in another are the odd ones
        dtypes = list(wrapped.values())
        common = max(sorted(set(dtypes)), key=lambda d: (dtypes.count(d), d == "fp32"))
        in_common = ", ".join(n for n, d in wrapped.items() if d == common)
        for name, dtype in wrapped.items():
            if dtype != common:
                out.append(
                    Problem(
                        ("model", "models", name, "dtype") if cfg.model.is_container else ("model", "dtype"),
                        f"`{name}` is stored in {dtype} and the other sub-models the FSDP plan wraps in {common} "
                        f"({in_common}): they pass activations "
                        "to each other, and with parallel.fsdp_plan.param_dtype unset nothing casts them (a dtype "
                        "mismatch at the first forward); set param_dtype (every unit then computes in it and casts "
                        "its inputs) or give them one dtype",
                        dtype,
                        deps=param_deps,
                    )
                )
    return out


def _pipeline_casts_inputs(cfg: TrainConfig) -> bool:
    """Whether the pipeline's options set the dtype it casts its models' inputs to (the schema's
    ``input_dtype_key``, e.g. Wan's ``predict_dtype``)."""
    owner = cfg.model.container_id if cfg.model.is_container else cfg.model.model_id
    key = getattr(pipeline_schema(owner), "input_dtype_key", None)
    return bool(key) and cfg.model.pipeline.get(key) is not None


def _lora_problems(cfg: TrainConfig) -> list[Problem]:
    """A sub-model with ``lora`` trains (only) its adapters on pretrained weights: it must have a weight
    source and be neither frozen nor left out of ``training.trainable_submodels``."""
    out: list[Problem] = []
    trainable = cfg.training.trainable_submodels
    for name, sub in cfg.model.sub_models().items():
        if sub.lora is None:
            continue
        loc: Loc = (("model", "models", name) if cfg.model.is_container else ("model",)) + ("lora",)
        if sub.freeze:
            out.append(
                Problem(loc, f"sub-model `{name}` is frozen (freeze: true): its adapters could not train")
            )
        elif not (sub.from_pretrained or sub.checkpoint_path):
            out.append(
                Problem(
                    loc,
                    f"sub-model `{name}` has no from_pretrained / checkpoint_path: LoRA adapts pretrained "
                    "weights, which its checkpoints do not hold (they reload from that source)",
                )
            )
        elif trainable is not None and name not in trainable:
            out.append(
                Problem(
                    loc,
                    f"sub-model `{name}` is not in training.trainable_submodels {trainable}: "
                    "its adapters would not train",
                    deps=(("training", "trainable_submodels"),),
                )
            )
    return out


def _pattern_head_problems(cfg: TrainConfig, names: set[str]) -> list[Problem]:
    plan = cfg.parallel.fsdp_plan
    lists: dict[Loc, list[str]] = {
        ("parallel", "fsdp_plan", "apply_modules"): plan.apply_modules,
        ("parallel", "fsdp_plan", "ignored_modules"): plan.ignored_modules,
        ("features", "recompute_plan", "apply_modules"): cfg.features.recompute_plan.apply_modules,
        ("features", "compile", "apply_modules"): cfg.features.compile.apply_modules,
        (
            "features",
            "activation_offload_plan",
            "apply_modules",
        ): cfg.features.activation_offload_plan.apply_modules,
    }
    out: list[Problem] = []
    for loc, patterns in lists.items():
        for i, pattern in enumerate(patterns):
            head = pattern_head(pattern)
            if head is not None and head not in names:
                out.append(
                    Problem(
                        loc + (i,),
                        f"first segment `{head}` is not a sub-model of model.models; "
                        f"{suggest(head, names, 'sub-model')}",
                        pattern,
                        deps=(("model", "models"),),
                    )
                )
    return out


def _batch_and_heads_problems(cfg: TrainConfig, world: int) -> list[Problem]:
    p, t = cfg.parallel, cfg.training
    out: list[Problem] = []
    dp = world // p.cp_size
    per_step = t.micro_batch_size * dp
    if (
        t.gradient_accumulation_steps is None
        and t.global_batch_size is not None
        and t.global_batch_size % per_step
    ):
        out.append(
            Problem(
                ("training", "global_batch_size"),
                f"must be a multiple of micro_batch_size ({t.micro_batch_size}) x data-parallel size ({dp} = "
                f"world {world} / ulysses x ring {p.cp_size}) = {per_step} to derive gradient_accumulation_steps",
                t.global_batch_size,
                deps=(("training", "micro_batch_size"), _ULYSSES, _RING),
            )
        )
    expected = t.micro_batch_size * (t.gradient_accumulation_steps or 0) * dp
    if t.gradient_accumulation_steps is not None and t.global_batch_size not in (None, expected):
        out.append(
            Problem(
                ("training", "global_batch_size"),
                f"expected micro_batch_size ({t.micro_batch_size}) x gradient_accumulation_steps "
                f"({t.gradient_accumulation_steps}) x data-parallel size ({dp} = world {world} / "
                f"ulysses x ring {p.cp_size}) = {expected}",
                t.global_batch_size,
                deps=(
                    ("training", "micro_batch_size"),
                    ("training", "gradient_accumulation_steps"),
                    _ULYSSES,
                    _RING,
                ),
            )
        )
    mbs = cfg.features.condition_micro_steps
    if mbs > 1 and mbs % p.cp_size:  # 1 = off: every rank encodes its own micro-batch
        out.append(
            Problem(
                ("features", "condition_micro_steps"),
                f"must be a multiple of ulysses x ring = {p.cp_size}: the ranks of a context-parallel "
                "group take turns encoding the micro-batches' conditions",
                mbs,
                deps=(_ULYSSES, _RING),
            )
        )
    trainable = (
        t.trainable_submodels if t.trainable_submodels is not None else cfg.model.trainable_submodels()
    )
    subs = cfg.model.sub_models()
    for name in trainable:
        base: Loc = ("model", "models", name) if cfg.model.is_container else ("model",)
        for key in _HEAD_KEYS:
            heads = subs[name].config.get(key)
            if isinstance(heads, int) and heads % p.ulysses_parallel_size:
                out.append(
                    Problem(
                        base + ("config", key),
                        f"must be divisible by parallel.ulysses_parallel_size "
                        f"({p.ulysses_parallel_size}): Ulysses splits attention heads across ranks",
                        heads,
                        deps=(_ULYSSES, ("training", "trainable_submodels")),
                    )
                )
            groups = p.ulysses_overlap.head_groups
            split = 0 if groups == "auto" else int(groups) * p.ulysses_parallel_size
            if isinstance(heads, int) and split > 1 and not heads % p.ulysses_parallel_size and heads % split:
                out.append(
                    Problem(
                        _OVERLAP + ("head_groups",),
                        f"{name}'s {heads} attention heads ({'.'.join(base + ('config', key))}) do not split into "
                        f"{groups} head groups over ulysses {p.ulysses_parallel_size}: heads must divide by "
                        f"head_groups x ulysses_parallel_size = {split}",
                        groups,
                        deps=(_ULYSSES, base + ("config", key)),
                    )
                )
    return out


__all__ = ["TrainConfig", "context_ranks_per_node", "context_world_size", "replicas_across_nodes"]
