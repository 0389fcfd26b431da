"""``mm-train``: train from a YAML config, under torchrun or as a single process.

mm-train --config run.yaml training.lr=1e-5 parallel.ulysses_parallel_size=2
torchrun --nproc-per-node 8 -m mm_trainer --config run.yaml
mm-train --config run.yaml --dry-run --world-size 64   # FSDP plan, bytes per rank; no weights
mm-train check-layouts --config run.yaml --layouts 1 2 2:ulysses=2 --steps 4   # same losses at each layout?
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import NoReturn

from mm_config import ConfigError, load_config


def build_parser(prog: str = "mm-train") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Train a registered model from a six-section YAML config (parallel, model, data, "
        "training, tools, features). The config is validated completely before anything starts.",
        epilog="Overrides are dotted YAML paths: training.lr=1e-5 model.models.predictor.freeze=true. "
        "`mm-train check-layouts --help`: compare a config's losses at several parallel layouts.",
    )
    parser.add_argument("--config", required=True, help="path of the YAML config")
    parser.add_argument("overrides", nargs="*", help="dotted overrides applied before validation")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="build the model on the meta device and print the FSDP plan (units, bytes per rank); "
        "allocates no weights and starts no process group",
    )
    parser.add_argument(
        "--world-size", type=int, default=None, help="world size for --dry-run (default: $WORLD_SIZE or 1)"
    )
    return parser


def main(argv: Sequence[str] | None = None, *, prog: str = "mm-train") -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["check-layouts"]:
        from mm_trainer.layout_check import main as check_layouts_main

        return check_layouts_main(argv[1:])
    args = build_parser(prog).parse_args(argv)
    world = args.world_size or int(os.environ.get("WORLD_SIZE", "1"))
    try:  # the full check (the Trainer repeats it); a dry run needs no weights or data on disk
        config = load_config(args.config, args.overrides, world_size=world, check_paths=not args.dry_run)
    except ConfigError as err:
        print(err, file=sys.stderr)
        return 2
    if args.dry_run:
        from mm_trainer.dry_run import dry_run

        print(dry_run(config, world_size=world))
        return 0
    from mm_trainer.trainer import Trainer

    trainer = Trainer(config)
    trainer.train()
    trainer.close()  # a normal end only: a failure leaves through run(), with no collective
    return 0


def run(entry: Callable[[], int] = main) -> NoReturn:
    """Process entry point (console script, ``python -m``): ``entry()`` (default :func:`main`), then
    :func:`mm_parallel.exit_process` with its code, so that no communication thread outlives the
    interpreter. Apps pass their own ``main``.

    Under torchrun the process asks for SIGTERM when its launcher dies (a stop, as any SIGTERM:
    :mod:`mm_trainer.stop_signals`). An exception ends this rank at once, with code 1 (130 for
    Ctrl-C outside the training loop), after printing it with its rank: no ``close()``, no
    collective, no waiting for the other ranks. torchrun then stops them; under another launcher
    they fail in their next collective, at the latest after ``training.collective_timeout_s``.
    """
    if os.environ.get("TORCHELASTIC_RUN_ID") is not None:
        from mm_parallel import signal_when_launcher_dies

        signal_when_launcher_dies()
    try:
        code = entry()
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - any failure ends this rank, reported
        _report_failure(exc)
        code = 130 if isinstance(exc, KeyboardInterrupt) else 1
    from mm_parallel import exit_process

    exit_process(code)


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
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return str(dist.get_rank())
    return os.environ.get("RANK", "0")


if __name__ == "__main__":
    run()
