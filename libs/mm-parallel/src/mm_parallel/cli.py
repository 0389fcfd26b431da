"""``mm-parallel`` command line.

``mm-parallel explain --model PKG.MODULE:FACTORY [--plan PLAN] --world-size N``
builds the model on the meta device (no memory, no process group) by calling
``FACTORY()`` and prints :func:`explain_fsdp_plan`'s table. ``PLAN`` is a JSON or
YAML file holding either the ``fsdp_plan`` mapping itself or a full config with
``parallel.fsdp_plan`` (YAML needs pyyaml installed). Building a model from a full
training config is the trainer's job; it can call :func:`explain_command` with
its own model builder.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mm_parallel import __version__

if TYPE_CHECKING:  # torch is imported by the command, not by --help / --version
    from torch import nn

    from mm_parallel.fsdp_plan import FSDPPlan


def load_plan_file(path: str | Path) -> FSDPPlan:
    """Read an FSDP plan from JSON/YAML: the plan mapping or a config with ``parallel.fsdp_plan``."""
    from mm_parallel.fsdp_plan import FSDPPlan

    path = Path(path)
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError as err:  # pragma: no cover - depends on the environment
            raise SystemExit(
                f"{path}: reading YAML needs pyyaml (pip install 'mm-parallel[yaml]') or use JSON"
            ) from err
        data: Any = yaml.safe_load(text) or {}
    else:
        data = json.loads(text)
    if not isinstance(data, dict):
        raise SystemExit(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    if "parallel" in data:
        data = (data["parallel"] or {}).get("fsdp_plan") or {}
    return FSDPPlan.from_dict(data, where=f"{path}: parallel.fsdp_plan")


def import_factory(spec: str) -> Callable[[], nn.Module]:
    """Resolve ``"pkg.module:callable"``."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise SystemExit(f"--model {spec!r}: expected 'package.module:factory'")
    return getattr(importlib.import_module(module_name), attr)


def explain_command(
    build_model: Callable[[], nn.Module], plan: FSDPPlan, world_size: int, dp_replicate: int = 1
) -> str:
    """Build the model on the meta device and return the explanation table."""
    import torch

    from mm_parallel.explain import explain_fsdp_plan

    with torch.device("meta"):
        model = build_model()
    return explain_fsdp_plan(model, plan, world_size, dp_replicate=dp_replicate).table()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``mm-parallel`` console script."""
    parser = argparse.ArgumentParser(prog="mm-parallel", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    explain = commands.add_parser("explain", help="show the FSDP units a plan makes of a model")
    explain.add_argument("--model", required=True, help="'package.module:factory' returning an nn.Module")
    explain.add_argument(
        "--plan", help="JSON/YAML file with the fsdp_plan (or a config with parallel.fsdp_plan)"
    )
    explain.add_argument("--world-size", type=int, required=True)
    explain.add_argument("--dp-replicate", type=int, default=1)
    args = parser.parse_args(argv)
    from mm_parallel.fsdp_plan import FSDPPlan

    plan = load_plan_file(args.plan) if args.plan else FSDPPlan()
    print(explain_command(import_factory(args.model), plan, args.world_size, args.dp_replicate))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
