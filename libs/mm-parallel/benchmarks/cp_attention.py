"""Time and peak memory per rank of one attention step (forward + backward) on CPU.

Configurations: P=1 (torch SDPA on the full sequence), Ulysses 2 and Ring 2 (zigzag, non-causal
by default) over real gloo process groups. Every configuration runs in fresh processes (one
per rank, one thread each).

How memory is measured: each rank allocates its local q, k, v and output gradient, then records
its resident set size (``/proc/self/statm``) as the baseline, runs ONE forward + backward of the
attention call while a thread samples RSS every millisecond, and reports peak minus baseline:
the activation / workspace / communication-buffer memory of the attention step. glibc's malloc
is told (``mallopt``) to serve every allocation >= 64 KiB with ``mmap`` so freed tensors really
leave the RSS instead of being cached by the heap.

Usage: ``python libs/mm-parallel/benchmarks/cp_attention.py [--seq 16384 --heads 8 --dim 64]``
"""

from __future__ import annotations

import argparse
import ctypes
import multiprocessing as mp
import os
import socket
import threading
import time
from functools import partial

import torch
import torch.distributed as dist
from mm_parallel import attention, ring_attention, ulysses_attention

_PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


class _PeakRSS:
    """Samples RSS in a background thread between ``start()`` and ``stop()``."""

    def __init__(self) -> None:
        self.peak, self._running = 0, False

    def _loop(self) -> None:
        while self._running:
            self.peak = max(self.peak, _rss())
            time.sleep(0.001)

    def start(self) -> None:
        self.peak, self._running = _rss(), True
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def stop(self) -> int:
        self._running = False
        self._thread.join()
        return max(self.peak, _rss())


def _rank_main(
    rank: int, world: int, port: int, kind: str, args: argparse.Namespace, queue: mp.Queue
) -> None:
    ctypes.CDLL("libc.so.6").mallopt(-3, 64 * 1024)  # M_MMAP_THRESHOLD: fixed, so frees return memory
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    group = dist.group.WORLD if world > 1 else None
    fn = {
        "p1": partial(attention, causal=args.causal),
        "ulysses": partial(ulysses_attention, group=group, causal=args.causal),
        "ring": partial(ring_attention, group=group, causal=args.causal, layout="zigzag"),
    }[kind]
    gen = torch.Generator().manual_seed(rank)
    shape = (1, args.seq // world, args.heads, args.dim)
    q, k, v = (torch.randn(shape, generator=gen).requires_grad_() for _ in range(3))
    dout = torch.randn(shape, generator=gen)
    dist.barrier()
    baseline, sampler = _rss(), _PeakRSS()
    sampler.start()
    start = time.perf_counter()
    fn(q, k, v).backward(dout)
    elapsed = time.perf_counter() - start
    peak = sampler.stop()
    dist.barrier()
    queue.put((rank, elapsed, (peak - baseline) / 2**20))
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(kind: str, world: int, args: argparse.Namespace) -> list[tuple[int, float, float]]:
    """Run one configuration in ``world`` fresh processes; return (rank, seconds, peak MiB) per rank."""
    ctx = mp.get_context("spawn")
    queue, port = ctx.Queue(), _free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, world, port, kind, args, queue)) for r in range(world)]
    for p in procs:
        p.start()
    results = sorted(queue.get(timeout=3600) for _ in procs)
    for p in procs:
        p.join()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=16384)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--causal", action="store_true")
    args = parser.parse_args()
    print(
        f"attention fwd+bwd, fp32, batch 1, seq {args.seq}, heads {args.heads}, dim {args.dim}, causal={args.causal}"
    )
    print(f"{'config':<10} {'rank':>4} {'time_s':>8} {'peak_MiB':>9} {'peak/P1':>8}")
    base = None
    for kind, world in (("p1", 1), ("ulysses", 2), ("ring", 2)):
        for rank, seconds, mib in run(kind, world, args):
            base = base if base is not None else mib
            print(f"{kind:<10} {rank:>4} {seconds:>8.2f} {mib:>9.1f} {mib / base:>8.2f}")


if __name__ == "__main__":
    main()
