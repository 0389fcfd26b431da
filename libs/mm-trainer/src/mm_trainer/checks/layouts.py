"""``mm-train check-layouts``: train one config briefly at several layouts and compare the losses.

A run's losses are a function of its config and data only (every random draw is keyed by seed, step
and sample; the sampler's global order does not depend on the layout). This command checks that on
the machine at hand before a long run at a new layout: it trains ``--steps`` steps of the config at
each layout (``torchrun`` on this host: gloo on CPU, or the real devices), prints the per-step loss of
each, and the largest relative difference from the first layout; exit 1 past ``--tolerance``.

A layout is ``WORLD[:key=value,...]`` with keys ``ulysses``, ``ring``, ``replicate`` (HSDP
replicas, ``parallel.replicate_parallel_size``) and ``micro`` (``training.micro_batch_size``), e.g.
``1``, ``2``, ``2:ulysses=2``, ``4:ulysses=2,micro=1``. A layout is the whole split of its world: the
parallel keys it does not name take their defaults (:data:`LAYOUT_DEFAULTS`: no Ulysses, no Ring,
replicas and shard degree derived), not the config's, so ``2`` of a config with
``parallel.ulysses_parallel_size: 2`` is plain data parallelism; an override of one of them is refused
(name it in the layouts). ``micro`` left out keeps the config's micro batch.

Every layout trains the same global batch. A config with ``training.global_batch_size`` (and
``gradient_accumulation_steps`` left out) derives its accumulation per layout; a config with neither
is checked at the smallest global batch that every layout's ``micro_batch_size x data-parallel size``
divides (the command says so); a config whose ``gradient_accumulation_steps`` makes the layouts' global
batches differ is refused before anything runs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mm_config import ConfigError, ParallelConfig, apply_overrides, load_config, read_yaml

from mm_trainer.registry.plugins import import_plugins

LAYOUT_KEYS = {
    "ulysses": "parallel.ulysses_parallel_size",
    "ring": "parallel.ring_attention_size",
    "replicate": "parallel.replicate_parallel_size",
    "micro": "training.micro_batch_size",
}
#: The parallel keys every layout sets, each to the schema's default unless the layout names it.
LAYOUT_DEFAULTS = {
    f"parallel.{key}": ParallelConfig.model_fields[key].default
    for key in ("ulysses_parallel_size", "ring_attention_size", "replicate_parallel_size",
                "fully_shard_parallel_size")
}  # fmt: skip


@dataclass(frozen=True)
class Layout:
    """A world size and the config overrides that lay the run out on it."""

    spec: str
    world_size: int
    overrides: tuple[str, ...]

    @classmethod
    def parse(cls, spec: str) -> Layout:
        """``"4:ulysses=2,micro=1"`` -> world 4 with those overrides, and every other key of
        :data:`LAYOUT_DEFAULTS` at its default.

        Raises:
            ValueError: a malformed spec or an unknown key (the message lists the known ones).
        """
        world, _, rest = spec.partition(":")
        if not world.isdigit() or int(world) < 1:
            raise ValueError(f"layout {spec!r}: expected WORLD[:key=value,...] with WORLD a positive integer")
        named: dict[str, str] = {}
        for item in filter(None, rest.split(",")):
            key, sep, value = item.partition("=")
            if not sep or key not in LAYOUT_KEYS or not value.isdigit():
                raise ValueError(
                    f"layout {spec!r}: {item!r} is not key=integer with key one of {sorted(LAYOUT_KEYS)}"
                )
            named[LAYOUT_KEYS[key]] = value
        values = {**LAYOUT_DEFAULTS, **named}
        return cls(spec, int(world), tuple(f"{key}={value}" for key, value in values.items()))


@dataclass(frozen=True)
class GlobalBatch:
    """The global batch every layout trains; ``overrides`` set it where check-layouts chose it, and
    ``note`` says so (None where the config fixes it)."""

    size: int
    overrides: tuple[str, ...] = ()
    note: str | None = None


def common_global_batch(
    config: str | os.PathLike, layouts: Sequence[Layout], overrides: Sequence[str] = ()
) -> GlobalBatch:
    """The global batch of the check (see the module docstring), validated at every layout.

    Raises:
        ValueError: an override of a layout's key, a config invalid at a layout, or a
            ``gradient_accumulation_steps`` under which the layouts' global batches differ.
    """
    for override in overrides:
        key = override.partition("=")[0].strip()
        if key in LAYOUT_DEFAULTS:
            raise ValueError(
                f"override {override!r}: {key} is set by each layout (the ones that do not name it take "
                f"{LAYOUT_DEFAULTS[key]}); name it in the layouts instead, e.g. --layouts 2 2:ulysses=2"
            )
    batches = _global_batches(config, layouts, overrides)
    if len(set(batches.values())) == 1:
        return GlobalBatch(next(iter(batches.values())))
    least = math.lcm(*batches.values())
    training = apply_overrides(read_yaml(config), overrides).get("training") or {}
    accumulation = training.get("gradient_accumulation_steps")
    if accumulation is not None:  # (a global batch without it is derived per layout: never differs)
        raise ValueError(
            f"the layouts train different global batches {batches}: training.gradient_accumulation_steps "
            f"is {accumulation}, so the global batch follows the data-parallel size. Leave it out and set "
            f"training.global_batch_size (e.g. {least}, which every layout's micro batch x data-parallel "
            "size divides), so that each layout derives its accumulation"
        )
    fixed = (f"training.global_batch_size={least}",)
    _global_batches(config, layouts, [*overrides, *fixed])  # still valid at every layout
    note = (
        f"training.global_batch_size is not set: each layout would train micro batch x data-parallel size "
        f"samples per step {batches}; checking all at training.global_batch_size={least}, the smallest that "
        "every layout divides (set it, in the config or as an override, to check another)"
    )
    return GlobalBatch(least, fixed, note)


def _global_batches(
    config: str | os.PathLike, layouts: Sequence[Layout], overrides: Sequence[str]
) -> dict[str, int]:
    batches = {}
    for layout in layouts:
        try:
            resolved = load_config(config, [*overrides, *layout.overrides], world_size=layout.world_size)
        except ConfigError as err:
            raise ValueError(f"layout {layout.spec}: the config is invalid there:\n{err}") from err
        batches[layout.spec] = resolved.training.global_batch_size
    return batches


@dataclass
class LayoutReport:
    """Per-step losses of each layout and their largest relative difference from the first."""

    layouts: list[Layout]
    losses: list[list[float]]
    tolerance: float
    global_batch: GlobalBatch | None = None

    @property
    def max_rel_diff(self) -> float:
        reference = self.losses[0]
        return max(
            (_rel(value, ref) for run in self.losses[1:] for value, ref in zip(run, reference, strict=True)),
            default=0.0,
        )

    @property
    def ok(self) -> bool:
        return self.max_rel_diff <= self.tolerance

    def table(self) -> str:
        """Steps as rows, layouts as columns, then the verdict."""
        width = max(14, *(len(layout.spec) + 2 for layout in self.layouts))
        lines = ["step".ljust(6) + "".join(layout.spec.rjust(width) for layout in self.layouts)]
        for step, row in enumerate(zip(*self.losses, strict=True), start=1):
            lines.append(str(step).ljust(6) + "".join(f"{value:.8g}".rjust(width) for value in row))
        verdict = "OK" if self.ok else "FAILED"
        batch = f", global batch {self.global_batch.size}" if self.global_batch else ""
        lines.append(
            f"largest relative difference from layout {self.layouts[0].spec}: {self.max_rel_diff:.3g} "
            f"(tolerance {self.tolerance:g}{batch}): {verdict}"
        )
        return "\n".join(lines)


def check_layouts(
    config: str | os.PathLike,
    layouts: Sequence[Layout],
    *,
    steps: int,
    overrides: Sequence[str] = (),
    tolerance: float = 1e-4,
    work_dir: str | os.PathLike,
    timeout: float | None = None,
    global_batch: GlobalBatch | None = None,
) -> LayoutReport:
    """Train ``steps`` steps of ``config`` at each layout (in turn) and collect the per-step losses.

    The global batch is ``global_batch``, by default :func:`common_global_batch`'s (the report keeps
    it, with its note).

    Raises:
        ValueError: fewer than two layouts, or what :func:`common_global_batch` refuses (checked
            before anything runs).
        RuntimeError: a run failed (the message names its log file).
    """
    if len(layouts) < 2:
        raise ValueError("check-layouts needs at least two layouts to compare")
    batch = global_batch or common_global_batch(config, layouts, overrides)
    overrides = [*overrides, *batch.overrides]
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    losses = []
    for i, layout in enumerate(layouts):
        # a fresh folder per check: an earlier check's logs in the same work dir are another run's
        run_dir = Path(tempfile.mkdtemp(prefix=f"layout_{i}-", dir=work))
        losses.append(_train(config, layout, steps, overrides, run_dir, timeout))
    return LayoutReport(list(layouts), losses, tolerance, batch)


def _train(
    config: str | os.PathLike,
    layout: Layout,
    steps: int,
    overrides: Sequence[str],
    run_dir: Path,
    timeout: float | None,
) -> list[float]:
    run_overrides = [
        *overrides,
        *layout.overrides,
        f"training.train_iters={steps}",
        "training.save=null",
        "training.load=null",
        "training.reset_data_position=false",
        f"training.log_dir={run_dir}",
        "training.log_interval=1",
        "training.tensorboard=false",
    ]
    module = ["-m", "mm_trainer", "--config", str(config), *run_overrides]
    if layout.world_size == 1:
        command = [sys.executable, *module]
    else:
        launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={layout.world_size}"]
        command = [sys.executable, *launcher, *module]
    log = run_dir / "train.log"
    with open(log, "w") as out:
        proc = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, timeout=timeout, check=False)
    if proc.returncode != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-20:])
        raise RuntimeError(f"layout {layout.spec}: training exited {proc.returncode} (log: {log}):\n{tail}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [float(r["loss"]) for r in records]


def _rel(value: float, reference: float) -> float:
    if not (math.isfinite(value) and math.isfinite(reference)):
        return math.inf
    return abs(value - reference) / max(abs(reference), 1e-12)


def build_parser(prog: str = "mm-train check-layouts") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Train a config a few steps at each layout and compare the per-step losses (exit 1 when "
        "they differ past --tolerance): the check to run before a long run at a new cluster layout.",
        epilog="Layouts: WORLD[:key=value,...], keys ulysses, ring, replicate, micro; e.g. 1 2 2:ulysses=2. "
        "A layout's parallel keys that it does not name take their defaults (2 = plain data parallelism, "
        "whatever the config's ulysses); micro left out keeps the config's. Without "
        "training.global_batch_size every layout trains the smallest global batch they all divide. "
        "Overrides go before --layouts (or after --): mm-train check-layouts --config X training.lr=1e-4 "
        "--layouts 1 2",
    )
    parser.add_argument("--config", required=True, help="path of the YAML config")
    parser.add_argument(
        "--layouts", nargs="+", required=True, help="two or more layouts; the first is the reference"
    )
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps per layout (default 4)")
    parser.add_argument(
        "--tolerance", type=float, default=1e-4, help="largest relative loss difference (1e-4)"
    )
    parser.add_argument(
        "--work-dir",
        default=None,
        help="where runs write logs and metrics, one new layout_<i>-* folder per layout and check (default: a temp dir)",
    )
    parser.add_argument("--timeout", type=float, default=None, help="seconds each run may take")
    parser.add_argument("overrides", nargs="*", help="dotted overrides applied to every layout")
    return parser


def main(argv: Sequence[str] | None = None, *, plugins: Sequence[str] = ()) -> int:
    """The ``check-layouts`` subcommand: 0 within tolerance, 1 past it, 2 on a bad request or failed run.
    ``plugins`` (an app's plugin module) are imported once the arguments parsed (``--help`` answers
    without them, and without torch)."""
    args = build_parser().parse_args(argv)
    import_plugins(plugins)
    try:
        layouts = [Layout.parse(spec) for spec in args.layouts]
        if len(layouts) < 2:
            raise ValueError("check-layouts needs at least two layouts to compare")
        batch = common_global_batch(args.config, layouts, args.overrides)
        if batch.note:
            print(f"check-layouts: {batch.note}", flush=True)
        work = args.work_dir or tempfile.mkdtemp(prefix="mm-check-layouts-")
        report = check_layouts(
            args.config, layouts, steps=args.steps, overrides=args.overrides, tolerance=args.tolerance,
            work_dir=work, timeout=args.timeout, global_batch=batch,
        )  # fmt: skip
    except (ValueError, RuntimeError, subprocess.TimeoutExpired) as err:
        print(f"check-layouts: {err}", file=sys.stderr)
        return 2
    print(report.table())
    print(f"(runs in {work})")
    return 0 if report.ok else 1
