"""``mm-train``: train from a YAML config, under torchrun or as a single process.

mm-train --config run.yaml training.lr=1e-5 parallel.ulysses_parallel_size=2
torchrun --nproc-per-node 8 -m mm_trainer --config run.yaml
mm-train --config run.yaml --dry-run --world-size 64   # FSDP plan, layout, full memory / time estimate; no weights
mm-train --config run.yaml --dry-run --nnodes 8 --nproc-per-node 8   # + which process groups cross nodes
mm-train plan --config run.yaml --world-size 8 --device h200   # memory per rank by category, fit, step time, MFU
mm-train plan --config run.yaml --world-size 8 --device h100 --search   # the layouts that fit, fastest first
mm-train check-layouts --config run.yaml --layouts 1 2 2:ulysses=2 --steps 4   # same losses at each layout?
mm-train plot runs/my_run/ckpt [--out curves.png]   # loss, lr, grad norm, validation loss as a PNG
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import NoReturn

# Nothing here imports torch: --help, --version and a refused config answer in about a second
# (benchmarks/cli_start.py). The trainer, the planner and the plugins are imported once they are needed.
from mm_config import ConfigError, install_warning_filters, load_config

from mm_trainer import __version__
from mm_trainer.planner.device_specs import DEFAULT_DEVICE, DEVICES
from mm_trainer.planner.inputs import check_nodes, check_world, plan_device
from mm_trainer.run.exit_codes import EXIT_FAILED, EXIT_FINISHED, EXIT_INCOMPLETE
from mm_trainer.run.user_errors import (
    ProcessPlace,
    UserErrorClass,
    prints_here,
    rank_prefix,
    traceback_wanted,
    user_error_class,
    user_error_message,
)

EMA_HELP = (
    "write the EMA of the trained weights (a run with training.ema) instead of their last values; with "
    "--lora, the adapters' EMA"
)
"""``--ema`` of the apps' ``export`` commands."""

LEAVE_THE_MESSAGE_S = 10.0
"""Under torchrun, how long a rank whose user error another rank prints waits before it exits."""

TRAINER_COMMANDS = {
    "plan": "trace one real-size step on fake tensors: memory per rank by category, fit, step time, MFU; --search",
    "check-layouts": "train a config a few steps at several parallel layouts, compare the losses",
    "plot": "write a PNG of a run's loss (raw + smoothed), learning rate, grad norm and validation loss",
}


def build_parser(
    prog: str = "mm-train", *, version: str | None = None, commands: Mapping[str, str] | None = None
) -> argparse.ArgumentParser:
    """The train command's parser. Apps pass their ``version`` and their other ``commands``
    (name -> one-line help), which ``--help`` lists."""
    commands = {**(commands or {}), **TRAINER_COMMANDS}
    width = max(map(len, commands))
    listed = "\n".join(f"  {name:<{width}}  {text}" for name, text in commands.items())
    epilog = (
        f"other commands ({prog} COMMAND --help):\n{listed}\n\n"
        "Overrides are dotted YAML paths: training.lr=1e-5 model.models.predictor.freeze=true"
    )
    parser = argparse.ArgumentParser(
        prog=prog,
        usage="%(prog)s --config CONFIG [overrides ...] [--dry-run [--world-size N]]"
        + f"\n       %(prog)s {{{','.join(commands)}}} ...",
        description="Train a registered model from a six-section YAML config (parallel, model, data,\n"
        "training, tools, features). The config is validated completely before anything starts.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version or __version__}")
    parser.add_argument("--config", required=True, help="path of the YAML config")
    parser.add_argument("overrides", nargs="*", help="dotted overrides applied before validation")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="build the model on the meta device and print the FSDP plan (units, bytes per rank), the layout's "
        "process groups and the full estimate of `plan` (one step traced on fake tensors: memory per rank by "
        "category, fit, step time); allocates no weights and starts no real process group",
    )
    parser.add_argument(
        "--world-size", type=int, default=None, help="world size for --dry-run (default: $WORLD_SIZE or 1)"
    )
    parser.add_argument(
        "--prune-kept-checkpoints",
        action="store_true",
        help="let training.keep_last / keep_every delete the checkpoints that the retention they were saved "
        "under keeps (an earlier keep_every's milestones, an earlier larger keep_last); without it they stay, "
        "logged at each save",
    )
    parser.add_argument(
        "--no-plan",
        action="store_true",
        help="--dry-run: leave out the full estimate (its trace of one step takes minutes at real size: "
        "3 for Wan A14B, 7 for LTX-2 at 8 ranks on 2 busy CPU cores; it shows its progress on stderr)",
    )
    parser.add_argument(
        "--device",
        default=DEFAULT_DEVICE,
        help=f"--dry-run: the device of the full estimate ({', '.join(DEVICES)}; default {DEFAULT_DEVICE}; "
        "`plan --help` explains it)",
    )
    parser.add_argument(
        "--nnodes",
        type=int,
        default=None,
        help="nodes for --dry-run (with --nproc-per-node: world size = nnodes x nproc-per-node)",
    )
    parser.add_argument(
        "--nproc-per-node",
        type=int,
        default=None,
        help="ranks per node for --dry-run: the layout table says which process groups cross nodes "
        "(default: $LOCAL_WORLD_SIZE, else all ranks on one node)",
    )
    return parser


def _dry_run_layout(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[int, int | None]:
    """``(world size, ranks per node or None)`` from --world-size / --nnodes / --nproc-per-node; a dry
    run's layout and device are checked as ``plan`` checks them (:mod:`mm_trainer.planner.inputs`)."""
    world = args.world_size
    if args.nnodes is not None or args.nproc_per_node is not None:
        if not args.dry_run:
            parser.error(
                "--nnodes / --nproc-per-node describe the layout of a --dry-run; torchrun sets them for a run"
            )
        check_nodes(args.nnodes, args.nproc_per_node)
        if args.nnodes is not None:
            if args.nproc_per_node is None:
                parser.error("--nnodes needs --nproc-per-node")
            nodes_world = args.nnodes * args.nproc_per_node
            if world is not None and world != nodes_world:
                parser.error(
                    f"--world-size {world} != --nnodes {args.nnodes} x --nproc-per-node {args.nproc_per_node}"
                )
            world = nodes_world
    world = int(os.environ.get("WORLD_SIZE", "1")) if world is None else world
    if args.dry_run:
        check_world(world, args.nproc_per_node)
        if not args.no_plan:
            plan_device(args.device)
    return world, args.nproc_per_node


def main(
    argv: Sequence[str] | None = None,
    *,
    prog: str = "mm-train",
    version: str | None = None,
    commands: Mapping[str, str] | None = None,
    plugin: str | None = None,
) -> int:
    """Validate the config, then train (or ``--dry-run``); returns the exit code. Rank 0 prints where
    the run's directory, checkpoints and metrics are when it starts and when it ends.

    An app passes its ``plugin`` module, imported once the arguments parsed and the config validated
    (its schema comes from its torch-free ``mm_config.schemas`` entry point). A refused config raises
    :class:`~mm_config.ConfigError`, which :func:`run` reports with exit code 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["plan"]:  # the plugin is imported once the planner's inputs are checked
        from mm_trainer.planner.cli import main as plan_main

        return plan_main(argv[1:], prog=f"{prog} plan", plugins=() if plugin is None else (plugin,))
    if argv[:1] == ["check-layouts"]:
        from mm_trainer.checks.layouts import main as check_layouts_main

        return check_layouts_main(argv[1:], plugins=() if plugin is None else (plugin,))
    if argv[:1] == ["plot"]:
        from mm_trainer.tools.plot import main as plot_main

        return plot_main(argv[1:], prog=f"{prog} plot")
    parser = build_parser(prog, version=version, commands=commands)
    args = parser.parse_args(argv)
    try:
        world, per_node = _dry_run_layout(parser, args)
    except ValueError as err:  # a dry run's world size or device that the planner refuses
        print(f"{prog}: {err}", file=sys.stderr)
        return 2
    try:  # the full check (the Trainer repeats it); a dry run needs no weights or data on disk
        config = load_config(
            args.config,
            args.overrides,
            world_size=world,
            check_paths=not args.dry_run,
            ranks_per_node=per_node,
        )
    except ConfigError:
        raise  # reported by run(), on rank 0 alone, exit 2
    except ValueError as err:  # ranks per node that do not divide the world
        parser.error(str(err))
    _import_plugin(plugin)
    if args.dry_run:
        from mm_trainer.planner.dry_run import dry_run
        from mm_trainer.tools.progress import PhaseLog

        try:
            device = None if args.no_plan else args.device
            progress = PhaseLog("dry run")  # its trace takes minutes at real size: phases, units, time left
            print(
                dry_run(config, world_size=world, ranks_per_node=per_node, device=device, progress=progress)
            )
        except ValueError as err:  # an unknown --device, or what the build refuses
            print(f"{prog}: {err}", file=sys.stderr)
            return 2
        return 0
    from mm_trainer.run.summary import end_lines, start_lines
    from mm_trainer.trainer import Trainer

    trainer = Trainer(config, prune_kept_checkpoints=args.prune_kept_checkpoints)
    say = _rank0_printer(prog, trainer.rank)
    say(
        start_lines(
            config.training, resume_from=trainer.run_dir.resume_from, start_iteration=trainer.start_iteration
        )
    )
    try:
        iteration = trainer.train()
    except BaseException:  # say where the run's files are, then leave through run(): no close()
        say(end_lines(config.training, iteration=None))
        raise
    trainer.close()  # a normal end only: a failure leaves through run(), with no collective
    say(end_lines(config.training, iteration=iteration))
    return EXIT_FINISHED if iteration >= config.training.train_iters else EXIT_INCOMPLETE


def _import_plugin(plugin: str | None) -> None:
    """Import an app's plugin module (its registrations), where one is given."""
    if plugin is not None:
        from mm_trainer.registry.plugins import import_plugins

        import_plugins([plugin])


def _rank0_printer(prog: str, rank: int) -> Callable[[list[str]], None]:
    def say(lines: list[str]) -> None:
        if rank == 0:
            print("\n".join(f"{prog}: {line}" for line in lines), flush=True)

    return say


def run(entry: Callable[[], int] = main, *, prog: str = "mm-train") -> NoReturn:
    """Process entry point (console script, ``python -m``): ``entry()`` (default :func:`main`), then
    :func:`mm_parallel.exit_process` with its code, so that no communication thread outlives the
    interpreter. Apps pass their own ``main`` and ``prog``.

    Under torchrun the process asks for SIGTERM when its launcher dies (a stop, as any SIGTERM:
    :mod:`mm_trainer.run.stop_signals`). An exception ends this rank at once: no ``close()``, no
    collective, no waiting for the other ranks. torchrun then stops them; under another launcher
    they fail in their next collective, at the latest after ``training.collective_timeout_s``.

    - A user error (:mod:`mm_trainer.run.user_errors`: a refused config, a held lock, a missing
      file, a failing reward, a missing package, Ctrl-C outside the training loop) prints
      ``PROG: error: MESSAGE`` once (from rank 0 where every rank has it) and exits with its class's
      code (2, 65, 66, 69, 73, 130); ``MM_TRAIN_TRACEBACK=1`` adds the traceback.
    - Any other exception is a bug: printed with its traceback and its rank, code 1.

    The project's warning allowlist is installed first (:func:`mm_config.install_warning_filters`).
    """
    install_warning_filters()
    if os.environ.get("TORCHELASTIC_RUN_ID") is not None:
        from mm_parallel import signal_when_launcher_dies

        signal_when_launcher_dies()
    try:
        code = entry()
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - any failure ends this rank, reported
        code = _report(exc, prog)
    if "torch" not in sys.modules:  # no process group, no communication thread: a plain exit
        sys.exit(code)
    from mm_parallel import exit_process

    exit_process(code)


def _report(exc: BaseException, prog: str) -> int:
    """Print ``exc`` (inside its ``except``) as a user error or as a bug; its exit code."""
    kind = user_error_class(exc)
    if kind is not None and not traceback_wanted():
        _report_user_error(exc, kind, prog)
        return kind.exit_code
    _report_failure(exc)
    return kind.exit_code if kind is not None else EXIT_FAILED


def _report_user_error(exc: BaseException, kind: UserErrorClass, prog: str) -> None:
    """``PROG: error: MESSAGE`` on stderr from the rank that should say it (``[rank N]`` in front
    where it is not the same on every rank), and in torchrun's error file on every failing rank, so
    that its summary shows the message instead of a traceback."""
    place = ProcessPlace.current()
    message = user_error_message(exc, kind, prog)
    printed_here = prints_here(exc, kind, place)
    if printed_here:
        prefix = rank_prefix(exc, kind, place)
        sys.stderr.write("".join(f"{prefix}{line}\n" for line in message.splitlines()))
        sys.stderr.flush()
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file:
        try:
            with open(error_file, "w") as out:
                # torchrun's summary shows py_callstack: the message, not a traceback
                extra = {"py_callstack": message, "timestamp": str(int(time.time()))}
                json.dump({"message": {"message": f"{type(exc).__name__}: {exc}", "extraInfo": extra}}, out)
        except OSError as err:
            sys.stderr.write(f"[rank {place.rank}] (torchrun's error file not written: {err})\n")
    if not printed_here and error_file and place.world_size > 1:
        # torchrun stops every other worker once one has exited: a rank that leaves the message to
        # another waits (bounded) for that one to print it and exit first, or the message is lost
        time.sleep(LEAVE_THE_MESSAGE_S)


def _report_failure(exc: BaseException) -> None:
    """Print the exception (inside its ``except``) with this rank on each line to stderr, and leave it
    in torchrun's error file, whose summary names the first failing rank."""
    rank = _rank()
    lines = traceback.format_exc().rstrip("\n").splitlines()
    lines.append(f"failed on rank {rank} ({socket.gethostname()}): {type(exc).__name__}: {exc}")
    sys.stderr.write("".join(f"[rank {rank}] {line}\n" for line in lines))
    sys.stderr.flush()
    if os.environ.get("TORCHELASTIC_ERROR_FILE"):
        from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

        try:
            ErrorHandler().record_exception(exc)
        except OSError as err:
            sys.stderr.write(f"[rank {rank}] (torchrun's error file not written: {err})\n")


def _rank() -> str:
    return str(ProcessPlace.current().rank)


if __name__ == "__main__":
    run()
