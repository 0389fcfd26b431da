"""Training step time with a checkpoint every N steps: no saving, synchronous, asynchronous (not a test; prints a table).

Two gloo ranks train an FSDP2-sharded stack of linear layers with AdamW and save the full training
state (weights + both moments) through ``mm_checkpoint.DistributedCheckpointer`` every
``--save-every`` steps: ``save(...)`` (synchronous: every rank waits for the files) or
``save(..., background=True)`` (``training.async_save``: staged into host memory, written by a thread
on a separate gloo group, committed at a later step). The three modes run one after the other in
the same two processes (the reference in the same run).

Saves happen at the multiples of ``--save-every`` that leave ``--save-every`` steps after them (the
steady state of a long run; a save at the very end blocks for its whole write in either mode). Per
mode (after one untimed warm-up step): wall time of the run, and the time the training loop was
blocked by checkpointing (the save calls, waiting for the previous background save at the next one,
and committing one after a step); ``final wait`` is the end of training waiting for the last one. ``hidden`` is the share of the synchronous save's blocking that the
asynchronous one does not block: ``1 - blocked(async) / blocked(sync)``; ``extra`` is wall time above
the no-save run (it also counts training steps slowed by the writer threads, which share the CPU
cores with the training; on a machine shared with other jobs it is noise-dominated).

Usage: python benchmarks/checkpoint_save.py [--dim 2048] [--layers 24] [--batch 16] [--steps 16]
[--save-every 4] [--workdir /tmp/mm_ckpt_save_bench]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Any

MODES = ("no saving", "synchronous", "asynchronous")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_mode(mode: str, args: argparse.Namespace, model: Any, opt: Any, group: Any) -> dict[str, float]:
    import torch
    import torch.distributed as dist
    from mm_checkpoint import DistributedCheckpointer

    root = Path(args.workdir) / mode.replace(" ", "_")
    if dist.get_rank() == 0:
        shutil.rmtree(root, ignore_errors=True)
    dist.barrier()
    ckpt = DistributedCheckpointer(root, keep_last=1, background_group=group)
    x = torch.randn(args.batch, args.dim, generator=torch.Generator().manual_seed(dist.get_rank()))
    blocked = 0.0
    _step(model, opt, x)  # warm-up
    dist.barrier()
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        _step(model, opt, x)
        t0 = time.perf_counter()
        ckpt.check_pending()  # what the engine does after every step
        if mode != "no saving" and step % args.save_every == 0 and step <= args.steps - args.save_every:
            ckpt.save({"model": model, "optimizer": opt}, step, background=mode == "asynchronous")
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
    results = {mode: _run_mode(mode, args, model, opt, group) for mode in MODES}
    if rank == 0:
        _print_table(args, results)
    dist.barrier()
    dist.destroy_process_group()


def _print_table(args: argparse.Namespace, results: dict[str, dict[str, float]]) -> None:
    base = results["no saving"]["wall"]
    sync = results["synchronous"]
    saves = max(0, args.steps - args.save_every) // args.save_every
    print(
        f"{args.layers} x Linear({args.dim}, {args.dim}) fp32 + AdamW on 2 gloo ranks (FSDP2), batch {args.batch}, "
        f"{args.steps} steps, a save every {args.save_every} ({saves} saves of "
        f"{results['synchronous']['size'] / 2**30:.2f} GiB), {args.threads} thread(s) per rank"
    )
    print(
        f"{'mode':<14} {'wall s':>8} {'s/step':>8} {'blocked s':>10} {'hidden':>7} {'extra s':>8} {'final wait s':>13}"
    )
    for mode in MODES:
        r = results[mode]
        extra = r["wall"] - base
        hidden = "" if mode == "no saving" else f"{1 - r['blocked'] / sync['blocked']:.2f}"
        print(
            f"{mode:<14} {r['wall']:8.2f} {r['wall'] / args.steps:8.3f} {r['blocked']:10.2f} {hidden:>7} "
            f"{extra:8.2f} {r['final']:13.2f}"
        )
    print(f"async staging: {results['asynchronous']['staging'] / 2**30:.2f} GiB of host memory per rank")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dim", type=int, default=2048)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--save-every", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--workdir", default="/tmp/mm_ckpt_save_bench")
    args = p.parse_args()
    import torch.multiprocessing as mp

    mp.start_processes(_rank, args=(args, _free_port()), nprocs=2, start_method="fork")
    shutil.rmtree(args.workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
