"""One training step of a config, built and run by the trainer's own code on fake tensors.

:func:`trace_run` does, in a fake world of the config's size (:mod:`.fake_world`), what
``Trainer.__init__`` and ``TrainEngine.train_step`` do, through the same functions
(:mod:`mm_trainer.model.build`; docs/DESIGN.md "Build order"):

1. plugins, ``ParallelState`` (meshes over the fake group), the container on meta with LoRA,
   context-parallel hooks, features and the FSDP plan; materialization (``to_empty``) into fake
   tensors; the EMA, the optimizer (fused as on the target device) and its states (steady state:
   the states of step 1 exist before step 2 starts). No weight is read, nor initialized (LoRA's
   adapters neither: values change no shape).
2. Under the tracker (:mod:`.tracker`): the micro-steps of one optimizer step on the batch the
   container's ``planning_batch(data, micro_batch_size)`` describes (the config's real shapes), with
   gradient sync on the last one only; with ``gradient_accumulation_steps > 1`` the first and the
   last micro-step are traced (the ones between repeat the first: same memory, same time).
   ``features.condition_micro_steps = N``: the rank encodes its share of N micro-batches first
   (frozen encoders; traced once, its N conditions then held), as ``ConditionStream`` does.
   Then ``clip_grad_norm_``, the optimizer step, the EMA update, ``zero_grad``. With
   ``training.phases``: the step at which every phase updates, each phase's micro-steps and optimizer
   step in turn (as ``TrainEngine`` runs them), then the EMA. With ``data.packing``: the worst-case
   packed micro-batches of the token budget (:mod:`.packing`); when there are two, the ``smallest`` one's
   micro-steps first (parts ``smallest samples: micro-step ...``, their gradients then dropped), then the
   ``largest`` one's as the step's micro-steps (the timed ones): the peak is the larger of the two.
3. The Ulysses all-to-alls run with the target device type's overlap default, not the CPU one
   (:func:`.overlap.target_overlap`); their time hidden behind compute is read off the trace's order of
   collectives, waits and compute (:class:`.overlap.AsyncTimeline`).

What is not the trainer's code path: weights are not loaded (nothing is read), compile plans are
left out (the trace is eager: an upper bound for the compiled blocks' activations), and the
engine's host-side bookkeeping (loss logging, stop requests) is skipped, and the optimizer holds
the local shards of the parameters rather than the DTensors (:class:`LocalShards`: the same step).
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from mm_config import TrainConfig
from mm_parallel import clip_grad_norm_, set_gradient_sync, use_attention_backend
from mm_pipelines import SampleRNG
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.utils._pytree import tree_map_only

from mm_trainer.model.build import (
    build_ema,
    build_optimization,
    build_sharded_model,
    materialize,
    parallel_state_for,
)
from mm_trainer.planner.cost_model import CostModel, StepCost
from mm_trainer.planner.device_specs import DeviceSpec
from mm_trainer.planner.fake_world import fake_world
from mm_trainer.planner.inputs import check_world
from mm_trainer.planner.layouts import CONFIGURED, ParamShard, layout_view, param_shards
from mm_trainer.planner.overlap import target_overlap
from mm_trainer.planner.packing import PackedMicroBatch, part_prefix, planned_packs
from mm_trainer.planner.tracker import ModuleStats, PlanTracker, View, ViewPeak
from mm_trainer.registry.plugins import import_plugins
from mm_trainer.tools.progress import Progress as UnitProgress
from mm_trainer.tools.progress import clock

Progress = Callable[[str], None]
"""Announces a phase; a :class:`~mm_trainer.tools.progress.PhaseLog` also counts a phase's FSDP units."""
CPU = torch.device("cpu")


@dataclass
class TracedRun:
    """What one trace measured, for the configured layout and every requested view."""

    config: TrainConfig
    world_size: int
    device: DeviceSpec
    ranks_per_node: int
    peaks: dict[str, ViewPeak]
    views: dict[str, View]
    parts: dict[str, StepCost]
    accumulation: int
    modules: list[ModuleStats]
    kernels: dict[str, int]
    placeholders: int
    shards: list[ParamShard]
    features: list[str]
    units: int
    pipeline_flops: float | None
    """FLOPs per micro-batch as the pipeline reports them (the trainer's MFU metric), if it does."""
    seconds: float = 0.0
    max_rss_bytes: int = 0
    notes: list[str] = field(default_factory=list)
    packs: list[PackedMicroBatch] = field(default_factory=list)
    """``data.packing``: the packed micro-batches traced (the first one timed); empty: unpacked."""
    overlap: dict[str, int] = field(default_factory=dict)
    """The overlap defaults the trace ran with (the target device type's, :func:`.overlap.target_overlap`)."""

    def step_cost(self) -> StepCost:
        """The whole optimizer step: the first micro-step ``accumulation - 1`` times, the last once,
        the optimizer part, and (``condition_micro_steps``) this rank's share of the encoding; with
        ``training.phases``, every phase's (the step at which all of them update)."""
        phases: dict[str, list[str]] = {}  # the micro-step parts of each phase (one: none)
        for key in (k for k in self.parts if k.startswith("micro-step")):
            phases.setdefault(key.partition(" (")[2], []).append(key)
        total = StepCost()
        for micro in phases.values():
            first, last = self.parts[micro[0]], self.parts[micro[-1]]
            total = total + (first.scaled(self.accumulation - 1) if len(micro) > 1 else StepCost()) + last
        if "condition encoding" in self.parts:  # each rank encodes 1 of every cp micro-batches
            cp = self.config.parallel.ulysses_parallel_size * self.config.parallel.ring_attention_size
            total = total + self.parts["condition encoding"].scaled(self.accumulation / cp)
        for key in (k for k in self.parts if k.startswith("optimizer")):  # each phase's optimizer step
            total = total + self.parts[key]
        return total


def refuse_rollouts(model: Any) -> None:
    """Refuse a pipeline that samples and scores its own rollouts in the step (a ``scorer`` slot: Flow-GRPO,
    DiffusionNFT):
    its sampler's schedule and the rewards read values a traced step does not have.

    Raises:
        ValueError: naming the pipeline.
    """
    pipeline = getattr(model, "pipeline", None)
    if pipeline is not None and hasattr(pipeline, "scorer"):
        raise ValueError(
            f"a {type(pipeline).__name__} step (rollouts sampled and scored by training.rewards inside the step) "
            "is not planned yet: plan the same config without its reward fine-tuning phase for the update's "
            "memory, and add the rollout's (sampling_steps forwards of the policy without gradients)"
        )


def trace_run(
    config: TrainConfig,
    *,
    world_size: int,
    device: DeviceSpec,
    ranks_per_node: int | None = None,
    extra_views: Callable[[list[ParamShard]], list[View]] | None = None,
    progress: Progress = lambda line: None,
) -> TracedRun:
    """Trace one optimizer step of ``config`` on ``world_size`` ranks (rank 0) for ``device``; a world
    past :data:`~mm_trainer.planner.inputs.MAX_TRACED_WORLD_SIZE` is refused first."""
    check_world(world_size, ranks_per_node)
    started = time.perf_counter()
    per_node = ranks_per_node or world_size
    with fake_world(world_size) as fake:
        import_plugins(config.training.plugin)
        parallel_state = parallel_state_for(config, world_size, "cpu", timeouts=False)
        if config.parallel.ring_attention_size > 1:
            use_attention_backend(
                "auto", CPU
            )  # the traced kernel; the target's stands in (attention_standin)
        progress("building the model on meta (container, LoRA, context parallel, features, FSDP plan)")
        sharded = build_sharded_model(
            config, parallel_state, CPU, meta_init=True, compile_modules=False, log=progress
        )
        model = sharded.model
        refuse_rollouts(model)
        with fake:  # materialized into fake tensors: shapes, dtypes and storage sizes, no data
            for name, module in model.sub_models().items():
                materialize(name, module, CPU)
            ema = build_ema(model, config.training)
            shards = LocalShards(model)
            optimizer, _ = build_optimization(shards, config.training, device.device_type)
            shards.prime(optimizer)
            facts = param_shards(model, config, int(config.parallel.fully_shard_parallel_size))
            views = [layout_view(CONFIGURED, facts, default_shard=0, cpu_offload=False, traced=True)]
            views += extra_views(facts) if extra_views else []
            tracker = PlanTracker(
                model, optimizer, device=device, cost=CostModel(device, per_node), views=views, ema=ema
            )
            packs = planned_packs(model, config, parallel_state.dp_size)
            progress(f"tracing one step at world size {world_size} ({len(sharded.fsdp.units)} FSDP units)")
            with tracker, target_overlap(device) as overlap:
                flops = _step(model, shards, optimizer, ema, config, tracker, progress, packs)
            tracker.on_unit = None
    progress(f"step traced ({clock(time.perf_counter() - started)} since the build started)")
    notes = [f"compile not traced: {line}" for line in sharded.features.lines() if line.startswith("compile")]
    return TracedRun(
        config=config, world_size=world_size, device=device, ranks_per_node=per_node,
        peaks=tracker.view_peaks, views=tracker.views, parts=tracker.parts,
        accumulation=config.training.gradient_accumulation_steps,
        modules=list(tracker.modules.values()), kernels=tracker.kernels, placeholders=tracker.placeholders,
        shards=facts, features=sharded.features.lines(), units=len(sharded.fsdp.units), pipeline_flops=flops,
        seconds=time.perf_counter() - started,
        max_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, notes=notes, packs=packs,
        overlap=overlap,
    )  # fmt: skip


class LocalShards(torch.nn.Module):
    """The trainable parameters as this rank's local shards, for the optimizer.

    A run's AdamW steps FSDP's DTensor parameters, which is the same step on every rank's local
    shard: same states, same memory, same kernel. On fake tensors torch's DTensor sharding
    propagation of a fused optimizer op costs about a millisecond per parameter and list entry (an
    LTX-2 has 3,510 parameters), so the planner's optimizer holds the local shards (views of the
    same storages, under the same names) and is handed their gradients before it steps.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.pairs: list[tuple[torch.Tensor, torch.nn.Parameter]] = []
        self._named: list[tuple[str, torch.nn.Parameter]] = []
        for name, param in model.named_parameters():
            if param.requires_grad:
                local = torch.nn.Parameter(_local(param), requires_grad=True)
                self.pairs.append((param, local))
                self._named.append((name, local))

    def named_parameters(self, *args: Any, **kwargs: Any) -> Any:  # the names param_groups reads
        return iter(self._named)

    def parameters(self, *args: Any, **kwargs: Any) -> Any:
        return (p for _, p in self._named)

    def take_gradients(self) -> None:
        """Each local shard's gradient: the local part of its parameter's (None stays None)."""
        for param, local in self.pairs:
            local.grad = None if param.grad is None else _local(param.grad)

    def prime(self, optimizer: torch.optim.Optimizer) -> None:
        """Create the optimizer states (what step 1 leaves for every later step) with zero gradients."""
        for _, local in self.pairs:
            local.grad = torch.zeros_like(local)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _step(
    model: Any, shards: LocalShards, optimizer: torch.optim.Optimizer, ema: Any, config: TrainConfig,
    tracker: PlanTracker, progress: Progress, packs: list[PackedMicroBatch],
) -> float | None:  # fmt: skip
    """The traced optimizer step (the module docstring); returns the pipeline's FLOPs per micro-batch.
    With ``training.phases``, the step at which every phase updates (step 0), phase by phase as the
    engine runs them: each phase's micro-steps (``model(**batch, phase=name)``), its clipping and its
    optimizer step (the optimizer holds every phase's states; only the phase's parameters have
    gradients), then the EMA once. With ``packs`` (``data.packing``, no phases), every packed
    micro-batch but the first is traced first and its gradients dropped; the first is the step's."""
    training = config.training
    flops = None
    model.train()
    for index in range(len(packs) - 1, 0, -1):
        _micro_steps(model, config, tracker, progress, None, packs[index], part_prefix(packs[index], index))
        model.zero_grad(set_to_none=True)  # the step's own micro-steps start without gradients
    for phase in list(training.phases) or [None]:
        flops = _micro_steps(model, config, tracker, progress, phase, packs[0] if packs else None) or flops
        suffix = "" if phase is None else f" ({phase})"
        tracker.part = f"optimizer{suffix}"
        progress(f"optimizer step{suffix}")
        clip_grad_norm_([p for p in model.parameters() if p.grad is not None], training.clip_grad or 0.0)
        shards.take_gradients()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        model.zero_grad(set_to_none=True)
    if ema is not None:
        progress("EMA")
        ema.update()
    return float(flops) if flops is not None else None


def _micro_steps(
    model: Any, config: TrainConfig, tracker: PlanTracker, progress: Progress, phase: str | None,
    pack: PackedMicroBatch | None = None, prefix: str = "",
) -> float | None:  # fmt: skip
    """The traced micro-steps of one optimizer step (of ``phase``; of packed micro-batches ``pack``, their
    parts named with ``prefix``); the pipeline's FLOPs if it reports them."""
    training = config.training
    accum = training.gradient_accumulation_steps
    flops = None
    for micro in [0] if accum == 1 else [0, accum - 1]:
        label = f"{prefix}micro-step {micro + 1}/{accum}" + ("" if phase is None else f" ({phase})")
        if pack is None:
            batch = model.planning_batch(config.data, training.micro_batch_size)
        else:
            batch = model.planning_batch(config.data, training.micro_batch_size, pack=dict(pack.counts))
        rng = SampleRNG(seed=training.seed, step=0, sample_ids=batch.pop("sample_ids"), device=CPU)
        set_gradient_sync(model, micro == accum - 1)
        forward_units = _fsdp_units(model, trainable=False)
        if config.features.condition_micro_steps > 1:
            tracker.part = "condition encoding"
            progress(
                f"{label}: encoding conditions ({config.features.condition_micro_steps} micro-steps ahead)"
            )
            with _units(tracker, progress, f"{label}: encoding conditions", None) as encoded:
                conditions, held = _encode_ahead(model, batch, config)
            forward_units -= encoded.done  # the encoders' units ran here, not in the forward below
            batch = {"conditions": conditions}
        tracker.part = label
        progress(f"{label}: forward")
        with _units(tracker, progress, f"{label}: forward", forward_units):
            output = model(**batch, rng=rng, **({} if phase is None else {"phase": phase}))
        progress(f"{label}: backward")
        with _units(tracker, progress, f"{label}: backward", _fsdp_units(model, trainable=True)):
            (output.loss / accum).backward()
        flops = (getattr(output, "metrics", None) or {}).get("flops", flops)
        del output, batch
        if config.features.condition_micro_steps > 1:
            del conditions, held
    return flops


def _fsdp_units(model: torch.nn.Module, *, trainable: bool) -> int:
    """The FSDP units of ``model`` (``trainable``: those with a trainable parameter: backward runs them)."""
    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if trainable:
        units = [m for m in units if any(p.requires_grad for p in m.parameters())]
    return len(units)


def _units(tracker: PlanTracker, progress: Progress, label: str, total: int | None) -> UnitProgress:
    """The progress of ``label`` counted in FSDP units (each unit's end of forward / backward); silent
    unless ``progress`` counts (a :class:`~mm_trainer.tools.progress.PhaseLog`)."""
    count = getattr(progress, "count", None)
    units = count(label, total, "FSDP units") if count else UnitProgress(label, total, "", enabled=False)
    tracker.on_unit = units.advance
    return units


def _encode_ahead(model: Any, batch: dict, config: TrainConfig) -> tuple[dict, list[dict]]:
    """This rank's encoding and the N conditions it then holds (one encoded, the others received)."""
    conditions = model.encode_conditions(batch)
    held = [
        tree_map_only(torch.Tensor, torch.clone, conditions)
        for _ in range(config.features.condition_micro_steps - 1)
    ]
    return conditions, held
