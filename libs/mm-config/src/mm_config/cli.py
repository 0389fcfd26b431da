"""``mm-config check CONFIG [overrides...] [--world-size N] [--nproc-per-node M] [--no-path-check]``: print the resolved
config (and any warnings) or the error report."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from . import __version__
from .check import check_config
from .errors import ConfigError
from .loader import config_to_yaml

EXIT_OK = 0
EXIT_INVALID = 2


def build_parser() -> argparse.ArgumentParser:
    """The ``mm-config`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="mm-config", description="Validate six-section training YAML configs."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="validate CONFIG and print the resolved config (exit 2 if invalid)")
    check.add_argument("config", help="path of the YAML config")
    check.add_argument("overrides", nargs="*", help="dotted overrides, e.g. training.lr=1e-5")
    check.add_argument(
        "--world-size",
        type=int,
        default=None,
        help="number of ranks to resolve for (default: $WORLD_SIZE or 1)",
    )
    check.add_argument(
        "--nproc-per-node",
        type=int,
        default=None,
        help="ranks per node, for replicate_parallel_size: auto (default: $LOCAL_WORLD_SIZE, else one node)",
    )
    check.add_argument(
        "--no-plugins",
        action="store_true",
        help="import neither the modules in training.plugin nor the installed schema entry points (registered "
        "names and the model checks are then not checked)",
    )
    check.add_argument(
        "--no-model-checks",
        action="store_true",
        help="skip the checks that import the model's libraries (hf_config keys, freeze groups, plan patterns "
        "against the model built on the meta device)",
    )
    check.add_argument(
        "--no-path-check",
        action="store_true",
        help="do not require the paths the run reads to exist (e.g. on a login node without the data)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 valid, possibly with warnings on stderr; 2 invalid)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    bad = [a for a in extra if a.startswith("-") or "=" not in a]
    if bad:
        parser.error(f"unrecognized arguments: {' '.join(bad)}")
    args.overrides = [*args.overrides, *extra]  # overrides may follow options
    try:
        report = check_config(
            args.config,
            args.overrides,
            world_size=args.world_size,
            plugins=not args.no_plugins,
            check_paths=not args.no_path_check,
            ranks_per_node=args.nproc_per_node,
            model_checks=not args.no_model_checks,
        )
    except (ConfigError, ValueError) as err:
        print(err, file=sys.stderr)
        return EXIT_INVALID
    for warning in report.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    sys.stdout.write(config_to_yaml(report.config))
    return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
