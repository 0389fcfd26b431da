"""Training step time with a checkpoint every N steps: no saving, synchronous, asynchronous, each save with
and without its CRC-32s; and the load with and without checking them (not a test; prints two tables).

Two gloo ranks train an FSDP2-sharded stack of linear layers with AdamW and save the full training
state (weights + both moments) through ``mm_checkpoint.DistributedCheckpointer`` every
``--save-every`` steps: ``save(...)`` (synchronous: every rank waits for the files) or
``save(..., background=True)`` (``training.async_save``: staged into host memory, written by a thread
on a separate gloo group, committed at a later step). The three modes run one after the other in
the same two processes (the reference in the same run). The two ``no CRC`` modes save through torch's
plain ``FileSystemWriter`` instead of ``mm_checkpoint.ChecksummingWriter`` (the CRC-32 of every storage
item, ``mm_checksums.json``): whether the asynchronous save still hides its write with them.

What the checksums cost, per GiB, from runs interleaved so that other jobs' load hits both alike:
both ranks save the state ``--repeats`` times synchronously with and without CRC-32s in turn (which
goes first alternates), and load the last (checksummed) one ``--repeats`` times with
``DistributedCheckpointer(verify=True)`` and ``verify=False`` in turn (page cache warm for both);
medians. And the floor: ``zlib.crc32``'s throughput on this machine, one thread. ``--costs-only`` runs
these alone, without the training-loop modes.

Saves happen at the multiples of ``--save-every`` that leave ``--save-every`` steps after them (the
steady state of a long run; a save at the very end blocks for its whole write in either mode). Per
mode (after one untimed warm-up step): wall time of the run, and the time the training loop was
blocked by checkpointing (the save calls, waiting for the previous background save at the next one,
and committing one after a step); ``final wait`` is the end of training waiting for the last one. ``hidden`` is the share of the synchronous save's blocking that the
asynchronous one does not block: ``1 - blocked(async) / blocked(sync)``; ``extra`` is wall time above
the no-save run (it also counts training steps slowed by the writer threads, which share the CPU
cores with the training; on a machine shared with other jobs it is noise-dominated).

Usage: python benchmarks/checkpoint_save.py [--dim 2048] [--layers 24] [--batch 16] [--steps 16]
[--save-every 4] [--repeats 5] [--costs-only] [--workdir /tmp/mm_ckpt_save_bench]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MODES = ("no saving", "synchronous", "asynchronous", "synchronous, no CRC", "asynchronous, no CRC")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_mode(mode: str, args: argparse.Namespace, model: Any, opt: Any, group: Any) -> dict[str, float]:
    import torch
    import torch.distributed as dist
    from mm_checkpoint import DistributedCheckpointer

    root = Path(args.workdir) / mode.replace(" ", "_").replace(",", "")
    if dist.get_rank() == 0:
        shutil.rmtree(root, ignore_errors=True)
    dist.barrier()
    ckpt = DistributedCheckpointer(root, keep_last=1, background_group=group)
    x = torch.randn(args.batch, args.dim, generator=torch.Generator().manual_seed(dist.get_rank()))
    blocked = 0.0
    _step(model, opt, x)  # warm-up
    dist.barrier()
    start = time.perf_counter()
    with _writer(checksums="no CRC" not in mode):
        for step in range(1, args.steps + 1):
            _step(model, opt, x)
            t0 = time.perf_counter()
            ckpt.check_pending()  # what the engine does after every step
            if mode != "no saving" and step % args.save_every == 0 and step <= args.steps - args.save_every:
                ckpt.save(
                    {"model": model, "optimizer": opt}, step, background=mode.startswith("asynchronous")
                )
            blocked += time.perf_counter() - t0
        t0 = time.perf_counter()
        ckpt.finish_pending(600)  # the end of training waits for the save in flight
        final_wait = time.perf_counter() - t0
    dist.barrier()
    wall = time.perf_counter() - start
    size = sum(f.stat().st_size for f in root.rglob("*") if f.is_file()) if root.exists() else 0
    return {
        "wall": wall,
        "blocked": blocked,
        "final": final_wait,
        "staging": ckpt.staging_bytes,
        "size": size,
    }


@contextlib.contextmanager
def _writer(checksums: bool) -> Iterator[None]:
    """Saves through ``ChecksummingWriter`` (as shipped) or, without ``checksums``, torch's plain
    ``FileSystemWriter`` (the same writer less the CRC-32s)."""
    import mm_checkpoint.checkpointer as checkpointer
    from torch.distributed.checkpoint import FileSystemWriter

    shipped = checkpointer.ChecksummingWriter
    if not checksums:
        checkpointer.ChecksummingWriter = FileSystemWriter
    try:
        yield
    finally:
        checkpointer.ChecksummingWriter = shipped


def _time_saves(args: argparse.Namespace, model: Any, opt: Any) -> dict[bool, list[float]]:
    """Seconds of ``--repeats`` synchronous saves with and without CRC-32s, in turn (``keep_last: 1``)."""
    import torch.distributed as dist
    from mm_checkpoint import DistributedCheckpointer

    ckpt = DistributedCheckpointer(Path(args.workdir) / "interleaved", keep_last=1)
    times: dict[bool, list[float]] = {True: [], False: []}
    iteration = 0
    for repeat in range(args.repeats):
        for checksums in (True, False) if repeat % 2 == 0 else (False, True):
            iteration += 1
            with _writer(checksums):
                dist.barrier()
                t0 = time.perf_counter()
                ckpt.save({"model": model, "optimizer": opt}, iteration)
                dist.barrier()
            times[checksums].append(time.perf_counter() - t0)
    ckpt.save({"model": model, "optimizer": opt}, iteration + 1)  # with CRC-32s: what the loads read
    return times


def _time_loads(args: argparse.Namespace, model: Any, opt: Any) -> dict[bool, list[float]]:
    """Seconds of ``--repeats`` loads of the last interleaved (checksummed) save, checked and unchecked in turn."""
    import torch.distributed as dist
    from mm_checkpoint import DistributedCheckpointer

    root = Path(args.workdir) / "interleaved"
    times: dict[bool, list[float]] = {True: [], False: []}
    DistributedCheckpointer(root, verify=False).load({"model": model, "optimizer": opt})  # page cache warm
    for _ in range(args.repeats):
        for verify in (True, False):
            dist.barrier()
            t0 = time.perf_counter()
            DistributedCheckpointer(root, verify=verify).load({"model": model, "optimizer": opt})
            dist.barrier()
            times[verify].append(time.perf_counter() - t0)
    return times


def _crc_throughput() -> float:
    """GB/s of ``zlib.crc32`` over 256 MiB, one thread (best of 3)."""
    import zlib

    data = os.urandom(256 << 20)
    best = min(_timed(lambda: zlib.crc32(data)) for _ in range(3))
    return len(data) / best / 1e9


def _timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _step(model: Any, opt: Any, x: Any) -> None:
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _rank(rank: int, args: argparse.Namespace, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    import torch
    import torch.distributed as dist
    from mm_parallel import new_long_wait_group
    from torch import nn
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    group = new_long_wait_group(3600)
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(args.dim, args.dim, bias=False) for _ in range(args.layers)])
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    results = {} if args.costs_only else {mode: _run_mode(mode, args, model, opt, group) for mode in MODES}
    if args.costs_only:  # one step, so that the optimizer holds its moments (a full training state)
        _step(model, opt, torch.randn(args.batch, args.dim))
    saves = _time_saves(args, model, opt)
    loads = _time_loads(args, model, opt)
    if rank == 0:
        if results:
            _print_table(args, results)
        size = sum(f.stat().st_size for f in (Path(args.workdir) / "interleaved").rglob("*") if f.is_file())
        _print_costs(size, saves, loads, _crc_throughput())
    dist.barrier()
    dist.destroy_process_group()


def _print_table(args: argparse.Namespace, results: dict[str, dict[str, float]]) -> None:
    base = results["no saving"]["wall"]
    saves = max(0, args.steps - args.save_every) // args.save_every
    print(
        f"{args.layers} x Linear({args.dim}, {args.dim}) fp32 + AdamW on 2 gloo ranks (FSDP2), batch {args.batch}, "
        f"{args.steps} steps, a save every {args.save_every} ({saves} saves of "
        f"{results['synchronous']['size'] / 2**30:.2f} GiB), {args.threads} thread(s) per rank"
    )
    print(
        f"{'mode':<22} {'wall s':>8} {'s/step':>8} {'blocked s':>10} {'hidden':>7} {'extra s':>8} {'final wait s':>13}"
    )
    for mode in MODES:
        r = results[mode]
        extra = r["wall"] - base
        reference = results["synchronous, no CRC" if "no CRC" in mode else "synchronous"]
        hidden = (
            "" if not mode.startswith("asynchronous") else f"{1 - r['blocked'] / reference['blocked']:.2f}"
        )
        print(
            f"{mode:<22} {r['wall']:8.2f} {r['wall'] / args.steps:8.3f} {r['blocked']:10.2f} {hidden:>7} "
            f"{extra:8.2f} {r['final']:13.2f}"
        )
    print(f"async staging: {results['asynchronous']['staging'] / 2**30:.2f} GiB of host memory per rank")


def _print_costs(
    size: int, saves: dict[bool, list[float]], loads: dict[bool, list[float]], crc_gbs: float
) -> None:
    gib = size / 2**30
    for what, times, on, off in (
        ("synchronous save", saves, "with CRC-32s", "without"),
        ("load", loads, "checked (verify=True)", "unchecked"),
    ):
        with_, without = sorted(times[True]), sorted(times[False])
        mid = len(with_) // 2
        per_gib = (with_[mid] - without[mid]) / gib if gib else 0.0
        done = "saved" if what.endswith("save") else "loaded"
        print(
            f"{what} of {gib:.2f} GiB, {len(with_)} times each in turn: {on} median {with_[mid]:.2f} s "
            f"(min {with_[0]:.2f}), {off} median {without[mid]:.2f} s (min {without[0]:.2f}): the checksums cost "
            f"{per_gib:+.3f} s per GiB {done}"
        )
    print(
        f"zlib.crc32 on this machine: {crc_gbs:.2f} GB/s on one thread ({2**30 / 1e9 / crc_gbs:.3f} s per GiB)"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dim", type=int, default=2048)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--save-every", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=5, help="saves and loads timed with and without CRC-32s")
    p.add_argument(
        "--costs-only", action="store_true", help="the checksums' costs alone (no training-loop modes)"
    )
    p.add_argument("--workdir", default="/tmp/mm_ckpt_save_bench")
    args = p.parse_args()
    import torch.multiprocessing as mp

    mp.start_processes(_rank, args=(args, _free_port()), nprocs=2, start_method="fork")
    shutil.rmtree(args.workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
