"""``mm-train plan`` (and every app's ``plan``): will this config fit, and how fast will it run?

mm-train plan --config RUN.yaml --world-size 8 --device h200
mm-train plan --config RUN.yaml --nnodes 2 --nproc-per-node 8 --device 910b training.ema.decay=0.999
mm-train plan --config RUN.yaml --world-size 8 --device h100 --search      # the layouts that fit, fastest first
mm-train plan --config RUN.yaml --world-size 1 --device-memory 24 --search # a 24 GiB card
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mm_config import ConfigError, load_config

from mm_trainer.planner.device_specs import DEFAULT_DEVICE, DEFAULT_MARGIN, DEVICES, DeviceSpec
from mm_trainer.planner.inputs import PlanInputError, check_nodes, check_world, plan_device
from mm_trainer.registry.plugins import import_plugins
from mm_trainer.tools.progress import PhaseLog

if TYPE_CHECKING:  # the tracing modules import torch: --help and bad arguments answer without it
    from mm_trainer.planner.trace import TracedRun

EXIT_BAD_INPUT = 2


def build_parser(prog: str = "mm-train plan") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Build the config's model through the trainer's own code path on fake tensors with a fake "
        "process group of the target world size (nothing is read or allocated), trace one optimizer step at the "
        "config's real shapes and print, per rank: peak memory by category, whether it fits the device with a "
        "margin, the largest modules, the estimated step time and MFU. --search ranks the layouts that fit.",
        epilog=__doc__.split("\n", 1)[1]
        + "\ndevices:\n"
        + "\n".join(
            f"  {d.name:<5} {d.label}, {d.bf16_tflops:g} TFLOP/s bf16, {d.hbm_tbps} TB/s"
            for d in DEVICES.values()
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", required=True, help="path of the YAML config")
    parser.add_argument("overrides", nargs="*", help="dotted overrides applied before validation")
    parser.add_argument(
        "--world-size", type=int, help="ranks of the run (default: --nnodes x --nproc-per-node)"
    )
    parser.add_argument(
        "--nnodes", type=int, help="nodes (with --nproc-per-node; groups crossing nodes use the network)"
    )
    parser.add_argument("--nproc-per-node", type=int, help="ranks per node (default: all ranks on one node)")
    parser.add_argument(
        "--device", default=DEFAULT_DEVICE, help=f"{', '.join(DEVICES)} (default {DEFAULT_DEVICE}), or cpu"
    )
    parser.add_argument(
        "--device-memory", type=float, metavar="GiB", help="device memory, replacing the table's"
    )
    parser.add_argument(
        "--margin",
        type=float,
        default=DEFAULT_MARGIN,
        help="fraction of usable memory kept free (default 0.1)",
    )
    parser.add_argument(
        "--search", action="store_true", help="trace the layouts of this world size, print those that fit"
    )
    parser.add_argument("--top", type=int, default=5, help="--search: layouts printed with their overrides")
    parser.add_argument("--json", metavar="PATH", help="also write the numbers as JSON")
    return parser


def world_layout(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[int, int]:
    """``(world size, ranks per node)`` from the arguments, refusing inconsistent ones."""
    per_node = args.nproc_per_node
    check_nodes(args.nnodes, per_node)
    if args.nnodes is not None:
        if per_node is None:
            parser.error("--nnodes needs --nproc-per-node")
        world = args.nnodes * per_node
        if args.world_size is not None and args.world_size != world:
            parser.error(
                f"--world-size {args.world_size} != --nnodes {args.nnodes} x --nproc-per-node {per_node}"
            )
    elif args.world_size is not None:
        world = args.world_size
    else:
        parser.error("give --world-size N (or --nnodes K --nproc-per-node P)")
    check_world(world, per_node)
    return world, per_node or world


def main(
    argv: Sequence[str] | None = None, *, prog: str = "mm-train plan", plugins: Sequence[str] = ()
) -> int:
    """Plan (or search) and print; 2 for bad input: the arguments (:mod:`~mm_trainer.planner.inputs`,
    checked before ``plugins`` are imported and the config is read), the config check's report, or
    what the build refused."""
    parser = build_parser(prog)
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        world, per_node = world_layout(parser, args)
        device = plan_device(args.device, args.device_memory, args.margin)
        if args.top < 1:
            raise PlanInputError(f"--top must be >= 1, got {args.top}")
    except ValueError as err:  # before anything is imported, read or traced
        print(f"{prog}: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    from mm_trainer.planner.fake_world import PlanningError
    from mm_trainer.planner.report import render, summarize
    from mm_trainer.planner.trace import trace_run

    try:
        import_plugins(plugins)
        if args.search:  # the config's own layout need not suit this world size: the search replaces it
            return _search(args, world, per_node, device)
        config = load_config(
            args.config, args.overrides, world_size=world, check_paths=False, ranks_per_node=per_node
        )
        run = trace_run(
            config, world_size=world, device=device, ranks_per_node=per_node, progress=PhaseLog("plan")
        )
    except (ConfigError, ValueError, NotImplementedError, PlanningError, FileNotFoundError) as err:
        print(f"{prog}: {err}" if not isinstance(err, ConfigError) else err, file=sys.stderr)
        return EXIT_BAD_INPUT
    summary = summarize(run, margin=args.margin)
    print(render(summary, run, header=header(args.config, run)))
    if args.json:
        write_json(Path(args.json), run)
    return 0


def header(path: str, run: TracedRun) -> str:
    """The plan's first lines: what was planned, at which layout, for which device."""
    p, t, f = run.config.parallel, run.config.training, run.config.features
    nodes = run.world_size // run.ranks_per_node
    recompute = f.recompute_plan
    what = (
        f"recompute {recompute.policy} ({', '.join(recompute.apply_modules)})"
        if recompute.apply_modules
        else "no recompute"
    )
    return "\n".join([
        f"plan of {path}: world size {run.world_size} ({nodes} node(s) x {run.ranks_per_node}), {run.device.label}",
        f"layout: replicate {p.replicate_parallel_size} x shard {p.fully_shard_parallel_size} (ulysses "
        f"{p.ulysses_parallel_size} x ring {p.ring_attention_size}), {_micro_batch(run)} x "
        f"{t.gradient_accumulation_steps} accumulation, {what}, cpu offload {'on' if p.fsdp_plan.cpu_offload else 'off'}, "
        f"reshard after forward {'on' if p.fsdp_plan.reshard_after_forward else 'off'}",
        f"rank 0 of {run.world_size} traced (FSDP2 pads every rank's shards to one size and context parallelism "
        "splits evenly: every rank holds the same shapes)",
    ])  # fmt: skip


def _micro_batch(run: TracedRun) -> str:
    packing = getattr(run.config.data, "packing", None)
    if packing is None:
        return f"micro-batch {run.config.training.micro_batch_size}"
    return f"packed micro-batches of up to {packing.token_budget} tokens"


def plan_numbers(run: TracedRun, margin: float = DEFAULT_MARGIN) -> dict[str, Any]:
    """The plan as a JSON-ready dict (the trainer's step-1 comparison reads ``peak_bytes``)."""
    from mm_trainer.planner.layouts import CONFIGURED
    from mm_trainer.planner.report import summarize

    s = summarize(run, CONFIGURED, margin=margin)
    return {
        "device": run.device.name, "world_size": run.world_size, "peak_bytes": int(s.peak_bytes),
        "peak_part": s.peak_part, "categories": {k: int(v) for k, v in s.categories.items()},
        "host": {k: int(v) for k, v in s.host.items()}, "fits": s.fits, "usable_bytes": int(s.usable_bytes),
        "step_seconds": s.step_seconds, "mfu": s.mfu, "trace_seconds": run.seconds,
        "packs": [{"kind": p.kind, "samples": p.samples, "tokens": p.tokens, "describe": p.describe()} for p in run.packs],
    }  # fmt: skip


def write_json(path: Path, run: TracedRun) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(plan_numbers(run), indent=1))
    tmp.replace(path)


def _search(args: argparse.Namespace, world: int, per_node: int, device: DeviceSpec) -> int:
    from mm_trainer.planner.search import render_search, search_layouts

    result = search_layouts(args.config, args.overrides, world=world, ranks_per_node=per_node, device=device,
                            margin=args.margin, progress=PhaseLog("plan --search"))  # fmt: skip
    command = (
        f"torchrun --nnodes {world // per_node} --nproc-per-node {per_node} -m <app> --config {args.config}"
    )
    print(f"search of {args.config} on {world} x {device.label} ({device.memory_gib:.1f} GiB)")
    print(render_search(result, top=args.top, command=command))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
