"""``mm-train``: train from a YAML config, under torchrun or as a single process.

mm-train --config run.yaml training.lr=1e-5 parallel.ulysses_parallel_size=2
torchrun --nproc-per-node 8 -m mm_trainer --config run.yaml
mm-train --config run.yaml --dry-run --world-size 64   # FSDP plan, bytes per rank; no weights
mm-train check-layouts --config run.yaml --layouts 1 2 2:ulysses=2 --steps 4   # same losses at each layout?
"""

from __future__ import annotations

import argparse
import os
import sys
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
    try:
        config = load_config(args.config, args.overrides, world_size=world)
    except ConfigError as err:
        print(err, file=sys.stderr)
        return 2
    if args.dry_run:
        from mm_trainer.dry_run import dry_run

        print(dry_run(config, world_size=world))
        return 0
    from mm_trainer.trainer import Trainer

    trainer = Trainer(config)
    try:
        trainer.train()
    finally:
        trainer.close()
    return 0


def run(entry: Callable[[], int] = main) -> NoReturn:
    """Process entry point (console script, ``python -m``): ``entry()`` (default :func:`main`), then
    :func:`mm_parallel.exit_process` with its code, so that no communication thread outlives the
    interpreter. Apps pass their own ``main``."""
    code = entry()
    from mm_parallel import exit_process

    exit_process(code)


if __name__ == "__main__":
    run()
