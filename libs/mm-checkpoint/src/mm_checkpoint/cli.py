"""``mm-ckpt``: convert, inspect and verify checkpoints (HF / diffusers safetensors <-> torch DCP)."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict

from . import __version__
from .errors import CheckpointError

# Everything that imports torch is imported inside the commands, so --help and --version stay fast.
_DTYPES = {"fp32": "float32", "float32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16",
           "fp16": "float16", "float16": "float16"}  # fmt: skip


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mm-ckpt", description=__doc__)
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    p.add_argument(
        "--plugin", action="append", default=[], help="module to import first (registers key maps)"
    )
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("convert", help="convert SRC to DST (safetensors -> dcp, or dcp -> safetensors)")
    c.add_argument("src")
    c.add_argument("dst")
    c.add_argument("--to", required=True, help="dcp | diffusers | hf | safetensors")
    c.add_argument("--from", dest="src_format", default="auto", help="source format (default: sniffed)")
    c.add_argument("--model-type", default=None, help="key map to apply (export: inverted), e.g. wan2_2")
    c.add_argument(
        "--submodel",
        default=None,
        help="export: the sub-model of a training checkpoint to write (e.g. predictor)",
    )
    c.add_argument("--max-shard-size", default="5GB", help="export shard size, e.g. 5GB")
    c.add_argument("--config-from", default=None, help="export: dir whose config.json etc. to copy")
    c.add_argument("--dtype", choices=sorted(_DTYPES), default=None, help="cast tensors")
    c.add_argument(
        "--ema",
        action="store_true",
        help="export: the EMA of the trainable parameters (a training.ema run) instead of their last values",
    )
    i = sub.add_parser("inspect", help="format, tensor count, bytes, dtypes, a few keys")
    i.add_argument("path")
    i.add_argument("--format", default="auto")
    i.add_argument("--json", action="store_true", help="print JSON")
    k = sub.add_parser(
        "check",
        help="check every file of a DCP checkpoint against the CRC-32 its save recorded (exit 1 if corrupted)",
    )
    k.add_argument("path", help="a checkpoint root (the tracker's iteration) or an iter_* dir")
    k.add_argument(
        "--iteration", type=int, default=None, help="the iteration to check (default: the tracker's)"
    )
    v = sub.add_parser("verify", help="compare two checkpoints after key mapping (exit 1 if they differ)")
    v.add_argument("a")
    v.add_argument("b")
    v.add_argument("--model-type", default=None)
    v.add_argument(
        "--atol",
        type=_tolerance,
        default=0.0,
        help="largest absolute difference of finite values still SAME (>= 0; inf: any finite difference); "
        "NaN / infinity positions must match at any tolerance",
    )
    v.add_argument(
        "--ignore-dtype",
        action="store_true",
        help="compare values only: equal values stored in different dtypes (fp32 vs bf16) are SAME",
    )
    return p


def _tolerance(text: str) -> float:
    """``--atol``: a float >= 0 (``inf`` allowed, NaN and negatives refused; argparse exits 2)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a tolerance >= 0 (inf allowed), got {text!r}")
    return value


def _convert(args: argparse.Namespace) -> int:
    import torch

    from .conversion import convert_to_dcp
    from .export import export_checkpoint
    from .formats import normalize_format, resolve_load_format

    to = normalize_format(args.to)
    dtype = getattr(torch, _DTYPES[args.dtype]) if args.dtype else None
    start = time.perf_counter()
    if to == "dcp":
        if args.ema:
            raise CheckpointError(
                "--ema applies to an export (--to diffusers | hf | safetensors), not --to dcp"
            )
        out = convert_to_dcp(
            args.src, args.dst, src_format=args.src_format, model_type=args.model_type, dtype=dtype
        )
    elif to in {"diffusers", "hf", "safetensors"}:
        if resolve_load_format(args.src, args.src_format) != "dcp":
            raise CheckpointError(
                f"{args.src} is not DCP: convert between safetensors flavours via --to dcp first"
            )
        out = export_checkpoint(args.src, args.dst, to=to, model_type=args.model_type, submodule=args.submodel,
                                config_from=args.config_from, max_shard_size=args.max_shard_size, dtype=dtype,
                                ema=args.ema)  # fmt: skip
    else:
        raise CheckpointError(f"--to {args.to!r}: expected dcp, diffusers, hf or safetensors")
    print(f"wrote {out} in {time.perf_counter() - start:.1f}s")
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from .inspection import summarize

    s = summarize(args.path, args.format)
    if args.json:
        print(json.dumps(asdict(s), indent=2))
        return 0
    print(f"path:    {s.path}\nformat:  {s.format}\ntensors: {s.tensors}")
    print(f"bytes:   {s.total_bytes} ({s.total_bytes / 1e9:.3f} GB)\ndtypes:  {s.dtypes}")
    print("keys:    " + "\n         ".join(s.sample_keys))
    return 0


def _check(args: argparse.Namespace) -> int:
    from .checksums import verify_checkpoint_dir
    from .errors import CheckpointIntegrityError
    from .layout import resolve_dcp_dir
    from .restricted_dcp import read_dcp_metadata
    from .zip_files import check_zip_crcs

    path, _ = resolve_dcp_dir(args.path, args.iteration)
    try:
        items = verify_checkpoint_dir(path, read_dcp_metadata(path))
        rank_files = sorted(path.glob("rank_state/*.pt"))
        for file in rank_files:
            check_zip_crcs(file)
    except CheckpointIntegrityError as err:
        print(f"CORRUPTED: {err}")
        return 1
    print(f"{path}: {items} storage items and {len(rank_files)} per-rank state files match their CRC-32: OK")
    return 0


def _verify(args: argparse.Namespace) -> int:
    from .inspection import verify_checkpoints

    r = verify_checkpoints(args.a, args.b, model_type=args.model_type)
    print(f"compared {r.compared} tensors; max abs diff {r.max_abs_diff:g} ({r.worst_key})")
    for label, keys in (
        ("only in A", r.only_in_a),
        ("only in B", r.only_in_b),
        ("shape mismatch", r.shape_mismatch),
        ("NaN in one only", r.nan_mismatch),
        ("infinity differs", r.inf_mismatch),
        ("dtype mismatch" + (" (ignored: --ignore-dtype)" if args.ignore_dtype else ""), r.dtype_mismatch),
    ):
        if keys:
            print(f"{label} ({len(keys)}): {keys[:10]}")
    same = r.same(args.atol, ignore_dtype=args.ignore_dtype)
    print("SAME" if same else "DIFFERENT")
    return 0 if same else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``mm-ckpt``; returns the exit code (2 for bad input)."""
    args = _parser().parse_args(argv)
    try:
        for module in args.plugin:
            importlib.import_module(module)
        commands = {"convert": _convert, "inspect": _inspect, "check": _check, "verify": _verify}
        return commands[args.command](args)
    except (CheckpointError, OSError, ValueError, ModuleNotFoundError) as e:
        print(f"mm-ckpt: error: {e}", file=sys.stderr)
        return 2


def run() -> None:
    """Console-script wrapper: ``sys.exit(main())``."""
    sys.exit(main())


if __name__ == "__main__":  # pragma: no cover
    run()
