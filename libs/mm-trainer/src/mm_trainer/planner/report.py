"""A traced step as numbers (:class:`PlanSummary`) and as the text ``mm-train plan`` prints.

Per rank, at the peak: the device memory by category (:mod:`.categories`), the host memory, whether
it fits the device with a margin, the largest modules, the step time by part and the MFU.

Fit: ``peak <= (device memory - reserved) x (1 - margin)``; the reserve is the device table's
estimate of what a process loses before its first tensor, the margin covers the caching
allocator's fragmentation (10% by default, ``--margin``).

MFU counts the FLOPs the pipeline reports per micro-batch (``metrics["flops"]``, what the trainer's
logged ``mfu`` counts) over all ranks; HFU counts every traced FLOP of this rank, recomputation
included. Both use the table's dense peak and the roofline step time (:mod:`.cost_model`), so they
are upper bounds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from mm_trainer.planner import checkpoint_staging as _checkpoint_staging  # noqa: F401 - registers its host line
from mm_trainer.planner.categories import (
    DEVICE_CATEGORIES,
    HOST_CATEGORIES,
    HOST_TAGS,
    HOST_TERMS,
    OFFLOADABLE,
    Tag,
)
from mm_trainer.planner.cost_model import BACKWARD_GATHER, StepCost
from mm_trainer.planner.device_specs import DEFAULT_MARGIN, DeviceSpec
from mm_trainer.planner.layouts import CONFIGURED
from mm_trainer.planner.packing import part_prefix
from mm_trainer.planner.rollouts import stage_seconds
from mm_trainer.planner.trace import TracedRun
from mm_trainer.planner.tracker import View

GIB = 2**30
HOST_ADAM_GBPS = 10.0
"""Host memory bandwidth one rank's CPU AdamW step gets (an estimate: a node's ~100 GB/s shared by its ranks)."""


@dataclass
class ModuleLine:
    """Modules of one pattern (numeric path segments as ``{*}``), per instance."""

    pattern: str
    count: int
    param_bytes: int
    kept_bytes: int
    seconds: float


@dataclass
class PlanSummary:
    """The numbers of one layout of a traced run (per rank)."""

    view: str
    device: DeviceSpec
    peak_bytes: float
    peak_part: str
    categories: dict[str, float]
    host: dict[str, float]
    part_peaks: dict[str, float]
    usable_bytes: float
    margin: float
    step_seconds: float
    cost: StepCost
    mfu: float | None
    hfu: float | None
    modules: list[ModuleLine] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return self.usable_bytes > 0 and self.peak_bytes <= self.usable_bytes * (1 - self.margin)

    @property
    def gap_bytes(self) -> float:
        """Bytes over the usable memory (with the margin); negative: the headroom."""
        return self.peak_bytes - self.usable_bytes * (1 - self.margin)


def summarize(run: TracedRun, view_name: str = CONFIGURED, *, margin: float = DEFAULT_MARGIN) -> PlanSummary:
    """The numbers of ``view_name`` (a view traced along, or the configured layout)."""
    view, peak = run.views[view_name], run.peaks[view_name]
    snapshot = peak.snapshot
    categories = {
        c.name: sum(snapshot.get(tag, 0) * view.device.get(tag, 1.0) for tag in c.tags)
        for c in DEVICE_CATEGORIES
    }
    host = {c.name: sum(snapshot.get(t, 0) * view.host.get(t, 1.0 if t in HOST_TAGS else 0.0) for t in c.tags)
            for c in HOST_CATEGORIES}  # fmt: skip
    for term in HOST_TERMS:
        line = term(run)
        if line is not None:
            host[line[0]] = float(line[1])
    cost = view_cost(run, view)
    seconds = cost.step_seconds() + offload_seconds(run, view)
    usable = run.device.memory_bytes - run.device.reserved_gib * GIB
    return PlanSummary(
        view=view_name, device=run.device, peak_bytes=peak.device, peak_part=peak.part, categories=categories,
        host=host, part_peaks=dict(peak.by_part), usable_bytes=usable, margin=margin, step_seconds=seconds,
        cost=cost, mfu=_mfu(run, seconds), hfu=_hfu(run, cost, seconds), modules=module_lines(run),
    )  # fmt: skip


def view_cost(run: TracedRun, view: View) -> StepCost:
    """The step's cost at ``view``'s layout: FSDP traffic scaled to its shard group (and crossing
    nodes when the group does), HSDP's all-reduce of the sharded gradients across replicas, no
    backward all-gathers where units stay gathered."""
    out = run.step_cost()
    if view.keep_gathered:  # reshard_after_forward: false gathers each unit once
        out.comm_s.pop(BACKWARD_GATHER, None)
        out.comm_bytes.pop(BACKWARD_GATHER, None)
    traced = int(run.config.parallel.fully_shard_parallel_size)
    if not view.shard or view.shard == traced or not run.device.intra_node_gbps:
        return out
    factor = _ring_factor(view.shard) / _ring_factor(traced) if traced > 1 else 0.0
    speed = _bandwidth(run, traced) / _bandwidth(run, view.shard)
    for kind in ("all-gather", "reduce-scatter", BACKWARD_GATHER):
        if kind in out.comm_s:
            out.comm_s[kind] *= factor * speed
            out.comm_bytes[kind] *= factor
    replicas = run.world_size // view.shard
    if replicas > 1:
        grads = sum(
            p.local_numel(p.fixed_shard or view.shard) * p.itemsize
            for p in run.shards
            if p.trainable and p.fsdp
        )
        wire = 2 * grads * (replicas - 1) / replicas
        out.add_comm(
            "all-reduce",
            wire,
            wire / (run.device.inter_node_gbps * 1e9) if run.device.inter_node_gbps else 0.0,
        )
    return out


def offload_seconds(run: TracedRun, view: View) -> float:
    """CPU offload's own time per step: parameters to the device for each gather (forward and
    backward), gradients back, and AdamW on the host (not overlapped: an upper bound)."""
    offload = view.offload if view.offload is not None else run.config.parallel.fsdp_plan.cpu_offload
    if not offload or not run.device.host_gbps:
        return 0.0
    shard = view.shard or int(run.config.parallel.fully_shard_parallel_size)
    params = sum(p.local_numel(p.fixed_shard or shard) * p.itemsize for p in run.shards if p.fsdp)
    grads = sum(
        p.local_numel(p.fixed_shard or shard) * p.itemsize for p in run.shards if p.fsdp and p.trainable
    )
    transfer = (2 * params + grads) / (run.device.host_gbps * 1e9)
    adam = 8 * grads / (HOST_ADAM_GBPS * 1e9)  # read w, g, m, v; write w, m, v (x ~2 passes)
    return transfer + adam


def _ring_factor(n: int) -> float:
    return (n - 1) / n if n > 1 else 0.0


def _bandwidth(run: TracedRun, group: int) -> float:
    within = group <= run.ranks_per_node
    return run.device.intra_node_gbps if within else run.device.inter_node_gbps


def _mfu(run: TracedRun, seconds: float) -> float | None:
    peak = run.device.bf16_tflops * 1e12
    if not run.pipeline_flops or not peak or seconds <= 0:
        return None
    dp = run.world_size // (
        run.config.parallel.ulysses_parallel_size * run.config.parallel.ring_attention_size
    )
    total = run.pipeline_flops * run.accumulation * dp
    return total / (seconds * peak * run.world_size)


def _hfu(run: TracedRun, cost: StepCost, seconds: float) -> float | None:
    peak = run.device.bf16_tflops * 1e12
    return cost.flops / (seconds * peak) if peak and seconds > 0 else None


def module_lines(run: TracedRun, top: int = 8) -> list[ModuleLine]:
    """The largest module patterns by memory per rank (parameters + activations kept), instances folded."""
    groups: dict[str, list] = {}
    for stats in run.modules:
        if not stats.calls:  # containers of modules (ModuleList) run nothing themselves
            continue
        pattern = re.sub(r"(?<=\.)\d+(?=\.|$)", "{*}", stats.path)
        groups.setdefault(pattern, []).append(stats)
    lines = [
        ModuleLine(pattern, len(items), max(s.param_bytes for s in items), max(s.kept_bytes for s in items),
                   sum(s.seconds for s in items) / len(items))
        for pattern, items in groups.items()
        if "." in pattern  # sub-models themselves are the sums of their children
    ]  # fmt: skip
    lines.sort(key=lambda line: (line.param_bytes + max(line.kept_bytes, 0)) * line.count, reverse=True)
    return lines[:top]


# --------------------------------------------------------------------------- text


def gib(nbytes: float) -> str:
    return f"{nbytes / GIB:.2f} GiB"


def _size(nbytes: float) -> str:
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def render(summary: PlanSummary, run: TracedRun, *, header: str = "") -> str:
    """The plan as ``mm-train plan`` prints it."""
    lines = [header] if header else []
    lines += _memory_lines(summary, run)
    lines += _packing_lines(summary, run)
    lines += _fit_lines(summary)
    lines += _module_table(summary)
    lines += _time_lines(summary, run)
    lines += _notes(run)
    return "\n".join(lines)


def _memory_lines(s: PlanSummary, run: TracedRun) -> list[str]:
    parts = ", ".join(f"{name} {gib(b)}" for name, b in s.part_peaks.items() if name != "setup")
    out = [f"peak memory per rank: {gib(s.peak_bytes)} (during {s.peak_part}; peak by part: {parts})"]
    for category in DEVICE_CATEGORIES:
        out.append(f"  {category.name:<28} {gib(s.categories[category.name]):>11}   {category.note}")
    offloaded = [name for name, b in s.host.items() if b]
    out.append(
        f"host memory per rank: {gib(sum(s.host.values()))}" + ("" if offloaded else " (nothing offloaded)")
    )
    for name in offloaded:
        out.append(f"  {name:<28} {gib(s.host[name]):>11}")
    return out


def _packing_lines(s: PlanSummary, run: TracedRun) -> list[str]:
    """``data.packing``: the packed micro-batches planned, each with its peak; the planned one."""
    if not run.packs:
        return []
    budget = run.packs[0].budget
    peaks = [
        max((b for name, b in s.part_peaks.items() if _pack_part(name, part_prefix(pack, i))), default=0.0)
        for i, pack in enumerate(run.packs)
    ]
    worst = max(range(len(peaks)), key=peaks.__getitem__)
    out = [
        f"packed micro-batches (data.packing.token_budget={budget}): the worst cases for the data's shapes, "
        f"{len(run.packs)} traced, the larger peak planned (mm_trainer.planner.packing)"
    ]
    for i, (pack, peak) in enumerate(zip(run.packs, peaks, strict=True)):
        role = "planned" if i == worst else "traced"
        timed = ", timed" if i == 0 else ""
        out.append(f"  {pack.kind:<8} {pack.describe()}: peak {gib(peak)} ({role}{timed})")
    return out


def _pack_part(name: str, prefix: str) -> bool:
    return name.startswith(f"{prefix}micro-step")


def _fit_lines(s: PlanSummary) -> list[str]:
    if s.usable_bytes <= 0:
        return [f"fit: not judged ({s.device.label} has no memory figure; pass --device-memory GiB)"]
    budget = s.usable_bytes * (1 - s.margin)
    verdict = "FITS" if s.fits else "DOES NOT FIT"
    gap = f"headroom {gib(-s.gap_bytes)}" if s.fits else f"short by {gib(s.gap_bytes)}"
    return [
        f"{verdict} on {s.device.label}: {gib(s.peak_bytes)} of {gib(budget)} usable "
        f"({s.device.memory_gib:.1f} GiB - {s.device.reserved_gib:.1f} GiB reserved, {s.margin:.0%} margin): {gap}"
    ]


def _module_table(s: PlanSummary) -> list[str]:
    if not s.modules:
        return []
    out = [
        "largest modules (per rank, per instance: parameters, activations its forward leaves, forward time):",
        f"  {'module':<44} {'x':>3} {'params':>10} {'activations':>12} {'forward':>10}",
    ]
    for m in s.modules:
        out.append(
            f"  {m.pattern:<44} {m.count:>3} {_size(m.param_bytes):>10} {_size(max(m.kept_bytes, 0)):>12} "
            f"{m.seconds * 1e3:>7.1f} ms"
        )
    return out


def _time_lines(s: PlanSummary, run: TracedRun) -> list[str]:
    device = s.device
    if not device.bf16_tflops:
        return ["step time: not estimated (the CPU check has no FLOP/s figures)"]
    c = s.cost
    comm = ", ".join(f"{kind} {seconds:.3f} s" for kind, seconds in sorted(c.comm_s.items()) if seconds)
    out = [
        f"step time (roofline on {device.name}: {device.bf16_tflops:.0f} TFLOP/s bf16, {device.hbm_tbps} TB/s HBM): "
        f"{s.step_seconds:.2f} s per optimizer step ({run.accumulation} micro-step(s))",
        f"  compute {c.compute_s:.2f} s (attention {c.attention_s:.2f} s, recomputation {_share(c.recompute_flops, c.flops)} of FLOPs), "
        f"communication exposed {c.exposed_comm_s():.2f} s of {comm or 'none'}",
    ]
    stages = stage_seconds(run.parts, run.accumulation)
    if stages:  # a rollout mode: each micro-step's rollout, rewards and update
        out.append(
            "  by stage: " + ", ".join(f"{stage} {seconds:.2f} s" for stage, seconds in stages.items())
        )
    hidden = ", ".join(
        f"{kind} {seconds:.3f} s" for kind, seconds in sorted(c.overlapped_s.items()) if seconds > 1e-9
    )
    modes = ", ".join(f"{name} {value}" for name, value in sorted(run.overlap.items()))
    out.append(
        f"  hidden behind compute: {hidden or 'none'} (overlap defaults on {device.device_type}: {modes or 'none'})"
    )
    mfu = f"{s.mfu:.1%}" if s.mfu is not None else "n/a (the pipeline reports no FLOPs)"
    hfu = f"{s.hfu:.1%}" if s.hfu is not None else "n/a"
    out.append(
        f"  MFU {mfu} (the pipeline's model FLOPs, as the trainer logs it); HFU {hfu} (every traced FLOP)"
    )
    return out


def _share(part: float, whole: float) -> str:
    return f"{part / whole:.0%}" if whole else "0%"


def _notes(run: TracedRun) -> list[str]:
    notes = list(run.notes)
    kernels = ", ".join(f"{k} x{n}" for k, n in sorted(run.kernels.items()))
    if kernels:
        notes.append(f"attention: {kernels} calls, memory and FLOPs from the kernels' models (CPU trace)")
    notes.append(
        "random draws are step 0's: a branch they decide (an expert, a conditioning path) follows them"
    )
    if run.placeholders:
        notes.append(
            f"{run.placeholders} value(s) read from fake tensors answered with a placeholder (True / 1)"
        )
    if any(run.views[CONFIGURED].host.get(tag, 0.0) > 0 for tag in OFFLOADABLE):
        notes.append(
            "CPU offload: host transfers and the host AdamW step are added to the step time, not overlapped"
        )
    traced = f"traced in {run.seconds:.0f} s, planner RSS {run.max_rss_bytes / GIB:.2f} GiB"
    return [f"notes: {traced}", *(f"  {n}" for n in notes)]


__all__ = ["PlanSummary", "render", "summarize", "Tag"]
