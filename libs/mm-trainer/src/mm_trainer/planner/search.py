"""``mm-train plan --search``: the layouts of a config for a world size, traced, filtered, ranked.

Enumerated: Ulysses x Ring (every pair the config check accepts: their product divides the world,
Ulysses divides the heads), the HSDP replicate size, recompute none / selective / full, CPU offload,
``reshard_after_forward`` and the micro-batch size. The global batch is held at the config's (a
run is a function of its config, not of its layout): a layout whose data-parallel size and
micro-batch do not divide it is not a candidate. Every candidate passes the config check first
(``mm_config.load_config`` with its overrides).

Traces: one per structurally different step, ``(ulysses, ring, recompute, micro-batch)``; the other
dimensions are read off that trace as views (:mod:`.layouts`: replicate size and offload move
per-rank state; ``reshard_after_forward: false`` keeps each unit's gathered parameters from its
forward to its backward, :class:`~mm_trainer.planner.tracker.View`). Per (ulysses, ring) the keys
go from the least memory to the most (full recompute first, then selective, then none; micro-batch
ascending); a key whose every view is over the budget rules out the keys that need at least as
much memory (less recomputation, a larger micro-batch), which are reported as such, not traced.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from mm_config import ConfigError, TrainConfig, load_config, parse_override

from mm_trainer.planner.device_specs import DeviceSpec
from mm_trainer.planner.inputs import check_world
from mm_trainer.planner.layouts import layout_view
from mm_trainer.planner.report import DEFAULT_MARGIN, PlanSummary, gib, summarize
from mm_trainer.planner.trace import trace_run
from mm_trainer.tools.progress import clock

RECOMPUTE = ("full", "selective", "none")  # least memory first


@dataclass(frozen=True)
class Layout:
    """One candidate layout."""

    ulysses: int
    ring: int
    replicate: int
    recompute: str
    offload: bool
    reshard: bool
    micro_batch: int

    @property
    def key(self) -> tuple[int, int, str, int]:
        """What needs a trace of its own."""
        return self.ulysses, self.ring, self.recompute, self.micro_batch

    def label(self) -> str:
        return (
            f"ulysses {self.ulysses} x ring {self.ring}, replicate {self.replicate}, recompute {self.recompute}, "
            f"offload {'on' if self.offload else 'off'}, reshard {'on' if self.reshard else 'off'}, "
            f"micro-batch {self.micro_batch}"
        )

    def overrides(
        self, recompute_modules: Sequence[str], global_batch: int, condition_steps: int
    ) -> list[str]:
        """Dotted overrides that turn the config into this layout (YAML values, shell-quoted where needed)."""
        modules = [] if self.recompute == "none" else list(recompute_modules)
        out = [
            f"parallel.ulysses_parallel_size={self.ulysses}",
            f"parallel.ring_attention_size={self.ring}",
            f"parallel.replicate_parallel_size={self.replicate}",
            "parallel.fully_shard_parallel_size=auto",
            f"parallel.fsdp_plan.cpu_offload={str(self.offload).lower()}",
            f"parallel.fsdp_plan.reshard_after_forward={str(self.reshard).lower()}",
            "features.recompute_plan.apply_modules=[" + ", ".join(f'"{m}"' for m in modules) + "]",
            f"training.micro_batch_size={self.micro_batch}",
            "training.gradient_accumulation_steps=null",
            f"training.global_batch_size={global_batch}",
        ]
        if self.recompute != "none":
            out.append(f"features.recompute_plan.policy={self.recompute}")
        else:  # a plan of no modules takes no options (mm-config refuses them: they would act on nothing)
            out += ["features.recompute_plan.policy=full", "features.recompute_plan.every=1"]
        if condition_steps > 1:
            cp = self.ulysses * self.ring
            out.append(f"features.condition_micro_steps={cp * max(1, -(-condition_steps // cp))}")
        return out


@dataclass
class Candidate:
    layout: Layout
    overrides: list[str]
    summary: PlanSummary | None = None
    status: str = ""


@dataclass
class SearchResult:
    candidates: list[Candidate]
    traces: int
    seconds: float
    rejected: dict[str, int] = field(default_factory=dict)
    base: TrainConfig | None = None

    @property
    def fitting(self) -> list[Candidate]:
        fits = [c for c in self.candidates if c.summary is not None and c.summary.fits]
        return sorted(fits, key=lambda c: c.summary.step_seconds)  # type: ignore[union-attr]

    @property
    def closest(self) -> Candidate | None:
        traced = [c for c in self.candidates if c.summary is not None]
        return min(traced, key=lambda c: c.summary.gap_bytes, default=None)  # type: ignore[union-attr]


def recompute_modules(config: TrainConfig) -> list[str]:
    """What the search recomputes: the config's recompute patterns, else its FSDP units of trainable
    sub-models (the repeated blocks)."""
    if config.features.recompute_plan.apply_modules:
        return list(config.features.recompute_plan.apply_modules)
    trainable = set(config.training.trainable_submodels or config.model.trainable_submodels())
    return [p for p in config.parallel.fsdp_plan.apply_modules if p.split(".", 1)[0] in trainable]


def enumerate_layouts(config: TrainConfig, world: int) -> list[Layout]:
    """Every layout of ``world`` ranks that keeps the config's global batch (before the config check)."""
    divisors = [d for d in range(1, world + 1) if world % d == 0]
    batch = int(config.training.global_batch_size)
    out = []
    for ulysses, ring in itertools.product(divisors, divisors):
        if world % (ulysses * ring):
            continue
        dp = world // (ulysses * ring)
        if batch % dp:
            continue
        for micro in (m for m in range(1, batch // dp + 1) if (batch // dp) % m == 0):
            for replicate in (r for r in divisors if dp % r == 0):
                for recompute, offload, reshard in itertools.product(RECOMPUTE, (False, True), (True, False)):
                    out.append(Layout(ulysses, ring, replicate, recompute, offload, reshard, micro))
    return out


def search_layouts(
    path: str,
    overrides: Sequence[str],
    *,
    world: int,
    ranks_per_node: int,
    device: DeviceSpec,
    margin: float = DEFAULT_MARGIN,
    progress: Callable[[str], None] = lambda line: None,
) -> SearchResult:
    """Trace, filter and rank the layouts of ``path`` (+ ``overrides``) on ``world`` ranks (module docstring)."""
    check_world(world, ranks_per_node)
    started = time.perf_counter()
    base = _base_config(path, overrides, world, ranks_per_node)
    modules, batch = recompute_modules(base), int(base.training.global_batch_size)
    steps = base.features.condition_micro_steps
    candidates, rejected = [], {}
    for layout in enumerate_layouts(base, world):
        extra = layout.overrides(modules, batch, steps)
        try:
            load_config(
                path, [*overrides, *extra], world_size=world, check_paths=False, ranks_per_node=ranks_per_node
            )
        except ConfigError as err:
            reason = str(err).splitlines()[1].strip() if len(str(err).splitlines()) > 1 else str(err)
            rejected[reason] = rejected.get(reason, 0) + 1
            continue
        candidates.append(Candidate(layout, extra))
    by_key: dict[tuple, list[Candidate]] = {}
    for candidate in candidates:
        by_key.setdefault(candidate.layout.key, []).append(candidate)
    traces, order = 0, _trace_order(by_key)
    for key in order:
        group = by_key[key]
        blocker = _blocker(key, by_key)
        if blocker is not None:
            for c in group:
                c.status = (
                    f"not traced: needs at least the memory of {blocker.layout.label()}, which does not fit"
                )
            continue
        progress(
            f"trace {traces + 1} of at most {len(order)} (elapsed {clock(time.perf_counter() - started)}): "
            f"ulysses {key[0]} x ring {key[1]}, recompute {key[2]}, micro-batch {key[3]}"
        )
        traces += 1
        try:
            _trace_group(path, overrides, group, (modules, batch, steps), world=world, per_node=ranks_per_node,
                         device=device, margin=margin, progress=progress)  # fmt: skip
        except (ValueError, NotImplementedError) as err:  # the build refused the layout (e.g. no CP support)
            reason = str(err).splitlines()[0]
            traces -= 1
            progress(f"  refused by the build: {reason}")
            for c in group:
                c.status = f"refused by the build: {reason}"
    return SearchResult(candidates, traces, time.perf_counter() - started, rejected, base)


def _base_config(path: str, overrides: Sequence[str], world: int, ranks_per_node: int) -> TrainConfig:
    """The config at ``world`` ranks; when its own context-parallel layout does not fit that world,
    the config without it (the search replaces the layout anyway; its global batch is then the
    data-parallel one at micro-batch x accumulation)."""
    try:
        return load_config(
            path, list(overrides), world_size=world, check_paths=False, ranks_per_node=ranks_per_node
        )
    except ConfigError:
        plain = [*overrides, "parallel.ulysses_parallel_size=1", "parallel.ring_attention_size=1"]
        return load_config(path, plain, world_size=world, check_paths=False, ranks_per_node=ranks_per_node)


def differing(config: TrainConfig, overrides: Sequence[str]) -> list[str]:
    """The overrides that change ``config`` (a layout printed for pasting names only what it changes)."""
    tree = config.model_dump(mode="json")
    out = []
    for override in overrides:
        path, value = parse_override(override)
        node: object = tree
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if node != value:
            out.append(override)
    return out


def _trace_order(by_key: dict[tuple, list[Candidate]]) -> list[tuple]:
    return sorted(by_key, key=lambda k: (k[0], k[1], k[3], RECOMPUTE.index(k[2])))


def _blocker(key: tuple, by_key: dict[tuple, list[Candidate]]) -> Candidate | None:
    """A traced key of the same (ulysses, ring) needing no more memory than ``key``, none of whose
    views fits (then ``key`` cannot fit either)."""
    u, r, recompute, micro = key
    for other, group in by_key.items():
        if other[:2] != (u, r) or other == key:
            continue
        lighter = RECOMPUTE.index(other[2]) <= RECOMPUTE.index(recompute) and other[3] <= micro
        traced = [c for c in group if c.summary is not None]
        if lighter and traced and not any(c.summary.fits for c in traced):  # type: ignore[union-attr]
            return min(traced, key=lambda c: c.summary.gap_bytes)  # type: ignore[union-attr]
    return None


def _trace_group(
    path: str, overrides: Sequence[str], group: list[Candidate], args: tuple[list[str], int, int], *,
    world: int, per_node: int, device: DeviceSpec, margin: float, progress: Callable[[str], None],
) -> None:  # fmt: skip
    """Trace the group's step once (replicate 1, no offload, resharding) and read every member off it."""
    traced_layout = replace(group[0].layout, replicate=1, offload=False, reshard=True)
    extra = traced_layout.overrides(*args)
    config = load_config(
        path, [*overrides, *extra], world_size=world, check_paths=False, ranks_per_node=per_node
    )

    def views(shards: list) -> list:
        out = []
        for c in group:
            view = layout_view(c.layout.label(), shards, default_shard=world // c.layout.replicate,
                               cpu_offload=c.layout.offload)  # fmt: skip
            out.append(replace(view, keep_gathered=not c.layout.reshard))
        return out

    run = trace_run(config, world_size=world, device=device, ranks_per_node=per_node, extra_views=views,
                    progress=lambda line: None)  # fmt: skip
    for c in group:
        c.summary = summarize(run, c.layout.label(), margin=margin)
        c.status = "fits" if c.summary.fits else f"short by {gib(c.summary.gap_bytes)}"
    best = min(group, key=lambda c: c.summary.peak_bytes)  # type: ignore[union-attr]
    progress(
        f"  traced in {run.seconds:.0f} s: peak {gib(best.summary.peak_bytes)} at best ({best.layout.label()})"
    )  # type: ignore[union-attr]


def render_search(
    result: SearchResult, *, top: int = 5, command: str = "torchrun ... -m <app> --config RUN.yaml"
) -> str:
    """The ranked layouts that fit (the best ``top`` with their overrides), or the smallest gap."""
    lines = [
        f"searched {len(result.candidates)} layouts that pass the config check ({sum(result.rejected.values())} "
        f"refused by it) with {result.traces} traces in {result.seconds:.0f} s"
    ]
    fits = result.fitting
    if not fits:
        closest = result.closest
        if closest is None:
            return "\n".join([*lines, "nothing fits: no layout could be traced"])
        s = closest.summary
        lines.append(
            f"nothing fits: the smallest gap is {gib(s.gap_bytes)} ({closest.layout.label()}: peak {gib(s.peak_bytes)} "  # type: ignore[union-attr]
            f"of {gib(s.usable_bytes * (1 - s.margin))} usable)"  # type: ignore[union-attr]
        )
        return "\n".join(lines)
    lines.append(f"{len(fits)} layouts fit; fastest first (roofline step time):")
    lines.append(f"  {'#':>2} {'step':>8} {'peak':>10} {'MFU':>6}  layout")
    for i, c in enumerate(fits[: max(top, 10)], 1):
        s = c.summary
        mfu = f"{s.mfu:.0%}" if s.mfu is not None else "-"  # type: ignore[union-attr]
        lines.append(
            f"  {i:>2} {s.step_seconds:>6.2f} s {gib(s.peak_bytes):>10} {mfu:>6}  {c.layout.label()}"
        )  # type: ignore[union-attr]
    for i, c in enumerate(fits[:top], 1):
        changes = differing(result.base, c.overrides) if result.base is not None else c.overrides
        quoted = " ".join(f"'{o}'" if any(ch in o for ch in '[]{}" ') else o for o in changes)
        lines += [f"layout {i}:", f"  {command} {quoted}"]
    return "\n".join(lines)
