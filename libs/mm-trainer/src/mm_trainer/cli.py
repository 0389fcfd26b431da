"""``mm-train``: train from a YAML config, under torchrun or as a single process.

mm-train --config run.yaml training.lr=1e-5 parallel.ulysses_parallel_size=2
torchrun --nproc-per-node 8 -m mm_trainer --config run.yaml
mm-train --config run.yaml --dry-run --world-size 64   # FSDP plan, bytes per rank; no weights
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import NoReturn

from mm_config import ConfigError, load_config

from mm_trainer import __version__


def build_parser(
    prog: str = "mm-train", *, version: str | None = None, commands: Mapping[str, str] | None = None
) -> argparse.ArgumentParser:
    """The train command's parser. Apps pass their ``version`` and their other ``commands``
    (name -> one-line help), which ``--help`` lists."""
    epilog = "Overrides are dotted YAML paths: training.lr=1e-5 model.models.predictor.freeze=true"
    if commands:
        width = max(map(len, commands))
        listed = "\n".join(f"  {name:<{width}}  {text}" for name, text in commands.items())
        epilog = f"other commands ({prog} COMMAND --help):\n{listed}\n\n{epilog}"
    parser = argparse.ArgumentParser(
        prog=prog,
        usage="%(prog)s --config CONFIG [overrides ...] [--dry-run [--world-size N]]"
        + (f"\n       %(prog)s {{{','.join(commands)}}} ..." if commands else ""),
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
        help="build the model on the meta device and print the FSDP plan (units, bytes per rank); "
        "allocates no weights and starts no process group",
    )
    parser.add_argument(
        "--world-size", type=int, default=None, help="world size for --dry-run (default: $WORLD_SIZE or 1)"
    )
    return parser


def main(
    argv: Sequence[str] | None = None,
    *,
    prog: str = "mm-train",
    version: str | None = None,
    commands: Mapping[str, str] | None = None,
) -> int:
    """Validate the config, then train (or ``--dry-run``); returns the exit code. Rank 0 prints where
    the run's directory, checkpoints and metrics are when it starts and when it ends."""
    args = build_parser(prog, version=version, commands=commands).parse_args(argv)
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
    from mm_trainer.run_summary import end_lines, start_lines
    from mm_trainer.trainer import Trainer

    trainer = Trainer(config)
    say = _rank0_printer(prog, trainer.rank)
    say(
        start_lines(
            config.training, resume_from=trainer.run_dir.resume_from, start_iteration=trainer.start_iteration
        )
    )
    iteration = None
    try:
        iteration = trainer.train()
    finally:
        trainer.close()
        say(end_lines(config.training, iteration=iteration))
    return 0


def _rank0_printer(prog: str, rank: int) -> Callable[[list[str]], None]:
    def say(lines: list[str]) -> None:
        if rank == 0:
            print("\n".join(f"{prog}: {line}" for line in lines), flush=True)

    return say


def run(entry: Callable[[], int] = main) -> NoReturn:
    """Process entry point (console script, ``python -m``): ``entry()`` (default :func:`main`), then
    :func:`mm_parallel.exit_process` with its code, so that no communication thread outlives the
    interpreter. Apps pass their own ``main``."""
    code = entry()
    from mm_parallel import exit_process

    exit_process(code)


if __name__ == "__main__":
    run()
