"""``qwen-vl-train``: mm-train with the Qwen-VL plugin loaded, plus make-tiny and export.

qwen-vl-train make-tiny runs/qwen_vl_tiny                                      # tiny model + data
torchrun --nproc-per-node 2 -m qwen_vl_train --config configs/tiny_sft.yaml    # train
qwen-vl-train --config configs/qwen2_5_vl_7b_sft.yaml --dry-run --world-size 8 # FSDP plan on meta
qwen-vl-train export --checkpoint runs/qwen_vl_tiny/ckpt --out runs/qwen_vl_tiny/export
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from qwen_vl_train import __version__

COMMANDS: dict[str, str] = {
    "make-tiny": "write a random tiny Qwen2.5-VL folder and a ShareGPT dataset",
    "export": "export the trained model as a transformers folder",
}
"""The commands besides training (``qwen-vl-train --config ...``), with the line ``--help`` shows."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="qwen-vl-train", description="Qwen-VL tools; see the module docstring.")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    tiny = sub.add_parser("make-tiny", help=COMMANDS["make-tiny"])
    tiny.add_argument("out")
    tiny.add_argument("--seed", type=int, default=0)
    export = sub.add_parser("export", help=COMMANDS["export"])
    export.add_argument("--checkpoint", required=True, help="training checkpoint root (iter_* + tracker)")
    export.add_argument("--config", help="training config (default: <checkpoint>/config.yaml)")
    export.add_argument("--out", required=True)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        from mm_trainer.cli import main as train_main

        # the plugin registers the Qwen-VL pieces; imported once the arguments parsed and the config
        # validated (its schema is the torch-free config_schema), so --help and a refused config are quick
        return train_main(
            argv, prog="qwen-vl-train", version=__version__, commands=COMMANDS, plugin="qwen_vl_train.plugin"
        )
    args = _parser().parse_args(argv)
    if args.command == "make-tiny":
        from qwen_vl_train.tiny import make_tiny

        print(make_tiny(args.out, seed=args.seed))
        return 0
    from mm_config import load_config
    from mm_trainer import export_hf_model, load_run_config

    import qwen_vl_train.plugin  # noqa: F401

    config = (
        load_run_config(args.checkpoint) if args.config is None else load_config(args.config, world_size=1)
    )
    print(export_hf_model(config, args.checkpoint, args.out))
    return 0


def run() -> NoReturn:
    """Console-script and ``python -m`` entry: :func:`main`, leaving through ``mm_trainer.cli.run``."""
    from mm_trainer.cli import run as run_process

    run_process(main, prog="qwen-vl-train")


if __name__ == "__main__":
    run()
