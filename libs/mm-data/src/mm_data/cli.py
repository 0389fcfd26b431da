"""`mm-data` command line: make-synthetic, inspect, check, cache (with an importable encoder)."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections import Counter
from collections.abc import Sequence
from typing import Any

from . import __version__

# The commands import what they use (torch, PyAV): --help and --version answer without them.

__all__ = ["main"]


def _size(text: str) -> tuple[int, int]:
    try:
        h, w = text.lower().split("x")
        return int(h), int(w)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected HEIGHTxWIDTH, got {text!r}") from e


def _dataset_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("metadata", help="metadata file (.json, .jsonl, .csv, .parquet)")
    p.add_argument("--data-root", default=None, help="folder relative sample paths start from")
    p.add_argument("--num-frames", type=int, default=17)
    p.add_argument("--height", type=int, default=64)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--fps", type=float, default=None)
    p.add_argument("--frame-stride", type=int, default=None)
    p.add_argument("--frame-rule", default="4k+1", help="'4k+1', '8k+1' or 'none'")
    p.add_argument("--dataset-kwargs", default="{}", help="more VideoTextDataset kwargs as JSON")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mm-data", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("make-synthetic", help="write small mp4 clips of moving shapes + metadata.json")
    p.add_argument("out")
    p.add_argument("--num-clips", type=int, default=8)
    p.add_argument("--size", type=_size, action="append", help="HxW, repeatable (default 64x64 48x80 80x48)")
    p.add_argument("--fps", type=int, action="append", help="repeatable (default 16 8 12)")
    p.add_argument("--num-frames", type=int, action="append", help="repeatable (default 33 25 17)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--corrupt", type=int, default=0)
    p.add_argument("--too-short", type=int, default=0)
    p.add_argument("--images", type=int, default=0)
    p.add_argument("--index-colour", action="store_true")
    p = sub.add_parser("inspect", help="summarize a metadata file")
    p.add_argument("metadata")
    p.add_argument("--data-root", default=None)
    p.add_argument("--rows", type=int, default=3, help="rows to print")
    p = sub.add_parser(
        "check",
        help="decode every sample (in parallel, each under a deadline); list the bad ones (exit 1 if any)",
        description="Read every sample as training would, with --workers processes; a sample that is not a "
        "regular file, cannot be decoded or takes longer than --decode-timeout-s is listed with its path.",
    )
    _dataset_args(p)
    p.add_argument(
        "--workers", type=int, default=None,
        help="decoding processes (default: the usable CPUs, at most 8; 0 = this process)",
    )  # fmt: skip
    p.add_argument(
        "--decode-timeout-s", type=float, default=120.0,
        help="seconds one sample may take before it is reported as bad (default 120; 0 = no deadline)",
    )  # fmt: skip
    p = sub.add_parser(
        "cache",
        help="encode a dataset into a sharded, content-keyed latent cache; a re-run encodes only what changed "
        "(under torchrun the ranks split the work)",
    )
    _dataset_args(p)
    p.add_argument("--out", required=True, help="cache folder")
    p.add_argument("--encoder", required=True, help="module:function; called as fn(item) -> dict of tensors")
    p.add_argument("--shard-size", type=int, default=64, help="samples per shard file (on average)")
    p.add_argument(
        "--workers", type=int, default=2, help="DataLoader workers decoding clips (0: main process)"
    )
    p.add_argument("--prefetch", type=int, default=2, help="decoded clips each worker keeps ready")
    p.add_argument(
        "--uses-prompt", action="store_true",
        help="the encoder reads item['prompt'] (drawn per row): key rows with caption lists by position too",
    )  # fmt: skip
    return parser


def _dataset(args: argparse.Namespace, **extra: Any) -> Any:
    from .dataset import VideoTextDataset

    kwargs: dict[str, Any] = {**json.loads(args.dataset_kwargs), **extra}
    kwargs.setdefault("frame_offset", "start")
    return VideoTextDataset(
        args.metadata,
        data_root=args.data_root,
        num_frames=args.num_frames,
        height=args.height,
        width=args.width,
        fps=args.fps,
        frame_stride=args.frame_stride,
        frame_rule=None if args.frame_rule.lower() == "none" else args.frame_rule,
        **kwargs,
    )


def _make_synthetic(args: argparse.Namespace) -> int:
    from .synthetic import make_synthetic_dataset

    kwargs = {"sizes": args.size, "fps": args.fps, "num_frames": args.num_frames}
    path = make_synthetic_dataset(
        args.out,
        num_clips=args.num_clips,
        seed=args.seed,
        corrupt=args.corrupt,
        too_short=args.too_short,
        num_images=args.images,
        index_colour=args.index_colour,
        **{k: v for k, v in kwargs.items() if v},
    )
    print(path)
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from .metadata import read_metadata

    rows = read_metadata(args.metadata, data_root=args.data_root)
    missing = [r["path"] for r in rows if not os.path.exists(r["path"])]
    sizes = Counter((r.get("height"), r.get("width")) for r in rows)
    print(f"{args.metadata}: {len(rows)} samples, fields {sorted({k for r in rows for k in r})}")
    print(f"sizes (height, width): {dict(sizes.most_common(10))}")
    print(f"missing files: {len(missing)}" + "".join(f"\n  {p}" for p in missing[:20]))
    for row in rows[: args.rows]:
        print(json.dumps(row, ensure_ascii=False))
    return 0


def _check(args: argparse.Namespace) -> int:
    from .sample_check import check_samples, default_check_workers

    dataset = _dataset(args, decode_timeout_s=args.decode_timeout_s or None)
    workers = default_check_workers() if args.workers is None else args.workers
    bad = check_samples(dataset, workers=workers)
    print(f"{len(dataset)} samples, {len(bad)} bad")
    for b in bad:
        print(f"  [{b.index}] {b.path}: {b.reason}")
    return 1 if bad else 0


def _cache(args: argparse.Namespace) -> int:
    from .cache import cache_dataset
    from .file_records import sha256_file

    module_name, _, attr = args.encoder.partition(":")
    if not attr:
        raise SystemExit(f"--encoder must look like module:function, got {args.encoder!r}")
    module = importlib.import_module(module_name)
    encode_fn = getattr(module, attr)
    # the encoder's identity: its name and its module's source (edit the encoder: every sample is encoded again)
    identity = {"encoder": args.encoder, "source": sha256_file(module.__file__) if module.__file__ else None}
    if "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1:
        import torch.distributed as dist

        dist.init_process_group("gloo")
    report = cache_dataset(
        _dataset(args),
        encode_fn,
        args.out,
        identity=identity,
        uses_prompt=args.uses_prompt,
        shard_size=args.shard_size,
        num_workers=args.workers,
        prefetch=args.prefetch,
    )  # fmt: skip  (rank / world size: torchrun's env)
    print(report)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``mm-data`` console script."""
    args = _parser().parse_args(argv)
    handlers = {"make-synthetic": _make_synthetic, "inspect": _inspect, "check": _check, "cache": _cache}
    return handlers[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
