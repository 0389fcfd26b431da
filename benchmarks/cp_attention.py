"""Time and peak memory per rank of context-parallel attention on CPU: one op and a layer stack.

Configurations: P=1 (``mm_parallel.attention``, torch SDPA, on the full sequence), Ulysses 2 and
Ring 2 (zigzag, non-causal by default) over real gloo process groups. Every configuration runs in
fresh processes (one per rank, one intra-op thread each). Two measurements:

- ``attention op``: each rank allocates its local q, k, v ``[1, S/P, H, D]`` and output gradient,
  takes its resident set size (``/proc/self/statm``) as the baseline, runs ONE forward + backward
  of the attention call and reports peak minus baseline: the transient workspace and
  communication buffers of one call (inputs excluded). With a flash-style kernel this is small
  and dominated by communication buffers, so it does not shrink with P.
- ``layer stack``: ``--layers`` pre-norm transformer layers (LayerNorm -> q/k/v Linear ->
  CP attention -> out Linear -> residual; LayerNorm -> 4x MLP with GELU -> residual), hidden
  ``H * D``. Every rank builds the same seeded weights and only its local ``[1, S/P, hidden]``
  input and output gradient, takes the baseline, then runs forward + backward: peak minus baseline
  is the activation memory saved for backward across the layers (plus the parameter gradients,
  identical for every P), which context parallelism divides by P.

A thread samples RSS every millisecond between baseline and the end of backward. glibc's malloc
is told (``mallopt``) to serve every allocation >= 64 KiB with ``mmap`` so freed tensors really
leave the RSS instead of being cached by the heap.

``--overlap G [G ...]`` measures the Ulysses all-to-all overlap instead (:mod:`mm_parallel.ulysses`):
Ulysses 2, one attention op and the layer stack (``--what``), with each number of head groups ``G``
(``overlap_heads``, 1 = off); ``pG`` also overlaps the all-to-alls with the q/k/v projections
(``overlap_projections``: the layer hands its projections to the attention uncomputed; layer stack only,
the op has no projections). The configurations run in the same two processes, one step of
each in turn for ``--repeats`` rounds (after one warm-up step of each), forward alone and then forward +
backward, so that they see the same machine load; each row gives the fastest and the median round (a
round's time is the slower rank's), and ``vs first`` the fastest forward + backward over the first
row's (on a machine other jobs load, the fastest round is the one they disturbed least).

Usage: ``python benchmarks/cp_attention.py [--seq 16384 --heads 8 --dim 64 --layers 4]``,
``python benchmarks/cp_attention.py --overlap 1 2 p1 p2 [--repeats 5] [--device cpu|cuda]``
"""

from __future__ import annotations

import argparse
import ctypes
import multiprocessing as mp
import os
import socket
import statistics
import threading
import time
from collections.abc import Callable
from functools import partial

import torch
import torch.distributed as dist
from mm_parallel import attention, ring_attention, takes_projections, ulysses_attention
from torch import Tensor, nn

_PAGE = os.sysconf("SC_PAGE_SIZE")
_CONFIGS = (("p1", 1), ("ulysses", 2), ("ring", 2))
AttnFn = Callable[[Tensor, Tensor, Tensor], Tensor]


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


class _Layer(nn.Module):
    """Pre-norm transformer layer whose attention is the given (context-parallel) function."""

    def __init__(self, heads: int, dim: int, attn: AttnFn) -> None:
        super().__init__()
        hidden = heads * dim
        self.heads, self.attn = heads, attn
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.q, self.k, self.v = (nn.Linear(hidden, hidden) for _ in range(3))
        self.out = nn.Linear(hidden, hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))

    def forward(self, x: Tensor) -> Tensor:
        # x: batch, local_seq, hidden
        b, s, _ = x.shape
        # 1. Self-attention over the (split) sequence: q, k, v are batch, local_seq, heads, head_dim
        h = self.norm1(x)
        q, k, v = (lambda p=p: p(h).view(b, s, self.heads, -1) for p in (self.q, self.k, self.v))
        if not getattr(self.attn, "takes_projections", False):
            q, k, v = q(), k(), v()
        x = x + self.out(self.attn(q, k, v).flatten(2))
        # 2. MLP
        return x + self.mlp(self.norm2(x))


def _overlap_config(text: str) -> tuple[int, bool]:
    """``G`` -> (G head groups, projections not overlapped); ``pG`` -> (G, overlapped)."""
    groups = int(text.removeprefix("p"))
    if groups < 1:
        raise argparse.ArgumentTypeError(f"{text}: expected G or pG with G >= 1 head groups")
    return groups, text.startswith("p")


def _attn_fn(
    kind: str, group: dist.ProcessGroup | None, causal: bool, overlap: tuple[int, bool] = (1, False)
) -> AttnFn:
    heads, projections = overlap
    return {
        "p1": partial(attention, causal=causal),
        "ulysses": takes_projections(
            lambda q, k, v: ulysses_attention(
                q, k, v, group, causal=causal, overlap_heads=heads, overlap_projections=projections
            )
        ),
        "ring": partial(ring_attention, group=group, causal=causal, layout="zigzag"),
    }[kind]


def _device(args: argparse.Namespace, rank: int) -> torch.device:
    return torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")


def _op_step(
    fn: AttnFn, rank: int, world: int, args: argparse.Namespace, backward: bool = True
) -> Callable[[], None]:
    """Allocate local q, k, v and dout; return one forward (+ backward) of the attention call."""
    gen = torch.Generator().manual_seed(rank)
    shape = (1, args.seq // world, args.heads, args.dim)
    q, k, v = (torch.randn(shape, generator=gen).to(_device(args, rank)).requires_grad_() for _ in range(3))
    dout = torch.randn(shape, generator=gen).to(_device(args, rank))
    return (lambda: fn(q, k, v).backward(dout)) if backward else (lambda: fn(q, k, v))


def _stack_step(
    fn: AttnFn, rank: int, world: int, args: argparse.Namespace, backward: bool = True
) -> Callable[[], None]:
    """Build the seeded layer stack and the local input; return one forward (+ backward)."""
    torch.manual_seed(0)  # same weights on every rank
    stack = nn.Sequential(*(_Layer(args.heads, args.dim, fn) for _ in range(args.layers))).to(
        _device(args, rank)
    )
    gen = torch.Generator().manual_seed(1 + rank)
    shape = (1, args.seq // world, args.heads * args.dim)
    x, dout = (torch.randn(shape, generator=gen).to(_device(args, rank)) for _ in range(2))
    return (lambda: stack(x).backward(dout)) if backward else (lambda: stack(x))


def _rank_main(
    rank: int, world: int, port: int, kind: str, what: str, args: argparse.Namespace, queue: mp.Queue
) -> None:
    ctypes.CDLL("libc.so.6").mallopt(-3, 64 * 1024)  # M_MMAP_THRESHOLD: fixed, so frees return memory
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    fn = _attn_fn(kind, dist.group.WORLD if world > 1 else None, args.causal)
    step = {"op": _op_step, "stack": _stack_step}[what](fn, rank, world, args)
    dist.barrier()
    baseline, sampler = _rss(), _PeakRSS()
    sampler.start()
    start = time.perf_counter()
    step()
    elapsed = time.perf_counter() - start
    peak = sampler.stop()
    dist.barrier()
    queue.put((rank, elapsed, (peak - baseline) / 2**20))
    dist.destroy_process_group()


def _sync(args: argparse.Namespace) -> None:
    if args.device == "cuda":
        torch.cuda.synchronize()


def _interleaved(
    steps: list[Callable[[], None]], repeats: int, args: argparse.Namespace
) -> list[list[float]]:
    """Seconds of every step, ``repeats`` rounds of each step in turn (after one warm-up call of each),
    the ranks aligned before each call: the configurations see the same machine load."""
    for step in steps:
        step()
    times: list[list[float]] = [[] for _ in steps]
    for _ in range(repeats):
        for i, step in enumerate(steps):
            _sync(args)
            dist.barrier()
            start = time.perf_counter()
            step()
            _sync(args)
            times[i].append(time.perf_counter() - start)
    return times


def _overlap_rank_main(
    rank: int, world: int, port: int, what: str, args: argparse.Namespace, queue: mp.Queue
) -> None:
    torch.set_num_threads(args.threads)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    make = {"op": _op_step, "stack": _stack_step}[what]
    fns = [_attn_fn("ulysses", dist.group.WORLD, args.causal, overlap) for overlap in _configs(args, what)]
    with torch.no_grad():
        forward = _interleaved(
            [make(fn, rank, world, args, backward=False) for fn in fns], args.repeats, args
        )
    both = _interleaved([make(fn, rank, world, args) for fn in fns], args.repeats, args)
    queue.put((rank, forward, both))
    dist.destroy_process_group()


def _configs(args: argparse.Namespace, what: str) -> list[tuple[int, bool]]:
    """The overlap configurations of the ``what`` table (the op has no projections to overlap)."""
    return [c for c in args.overlap if what == "stack" or not c[1]]


def _overlap_table(args: argparse.Namespace) -> None:
    """Ulysses 2 with each overlap of ``args.overlap``: forward and forward + backward times."""
    print(
        f"Ulysses 2 all-to-all overlap ({args.device}, fp32, batch 1, seq {args.seq}, heads {args.heads}, dim "
        f"{args.dim}, {args.threads} thread(s) per rank): {args.repeats} rounds of every configuration in turn "
        "after 1 warm-up, fastest and median step, the slower rank's; 'vs first': fastest fwd+bwd over the "
        "first row's",
        flush=True,
    )
    head = ("what", "overlap", "fwd_min", "fwd_med", "both_min", "both_med", "vs first")
    print("{:<6} {:>13} {:>8} {:>8} {:>9} {:>9} {:>8}".format(*head), flush=True)
    for what in args.what:
        ctx = mp.get_context("spawn")
        queue, port = ctx.Queue(), _free_port()
        procs = [
            ctx.Process(target=_overlap_rank_main, args=(r, 2, port, what, args, queue)) for r in range(2)
        ]
        for p in procs:
            p.start()
        results = [queue.get(timeout=3600)[1:] for _ in procs]
        for p in procs:
            p.join()
        base = None
        for i, (groups, projections) in enumerate(_configs(args, what)):
            # per round, the slower rank's time; then the fastest and the median round
            forward, both = ([max(r[k][i][j] for r in results) for j in range(args.repeats)] for k in (0, 1))
            base = base if base is not None else min(both)
            overlap = f"{'p' if projections else ''}{groups}"
            print(
                f"{what:<6} {overlap:>13} {min(forward):>8.3f} {statistics.median(forward):>8.3f} "
                f"{min(both):>9.3f} {statistics.median(both):>9.3f} {min(both) / base:>8.3f}",
                flush=True,
            )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(kind: str, world: int, what: str, args: argparse.Namespace) -> list[tuple[int, float, float]]:
    """Run one configuration of ``what`` ("op" or "stack") in ``world`` fresh processes.

    Returns (rank, seconds, peak MiB above baseline) per rank.
    """
    ctx = mp.get_context("spawn")
    queue, port = ctx.Queue(), _free_port()
    procs = [
        ctx.Process(target=_rank_main, args=(r, world, port, kind, what, args, queue)) for r in range(world)
    ]
    for p in procs:
        p.start()
    results = sorted(queue.get(timeout=3600) for _ in procs)
    for p in procs:
        p.join()
    return results


def _table(title: str, what: str, args: argparse.Namespace) -> None:
    print(title)
    print(f"{'config':<10} {'rank':>4} {'time_s':>8} {'peak_MiB':>9} {'peak/P1':>8}")
    base = None
    for kind, world in _CONFIGS:
        for rank, seconds, mib in run(kind, world, what, args):
            base = base if base is not None else mib
            print(f"{kind:<10} {rank:>4} {seconds:>8.2f} {mib:>9.1f} {mib / base:>8.2f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=16384)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument(
        "--overlap", type=_overlap_config, nargs="+",
        help="measure Ulysses overlaps instead: G head groups (1 = off), pG = G and the projections overlapped",
    )  # fmt: skip
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per overlap configuration")
    parser.add_argument(
        "--what", nargs="+", choices=("op", "stack"), default=["op", "stack"], help="overlap tables"
    )
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per rank (overlap tables)")
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="device of the overlap tables"
    )
    args = parser.parse_args()
    if args.overlap:
        _overlap_table(args)
        return
    print(
        f"fp32, batch 1, seq {args.seq}, heads {args.heads}, dim {args.dim}, causal={args.causal}; "
        "time = one forward + backward, peak = peak RSS above baseline per rank"
    )
    _table(
        "attention op: one call's transient workspace + communication buffers (local q/k/v excluded)",
        "op",
        args,
    )
    _table(
        f"layer stack: {args.layers} pre-norm layers (hidden {args.heads * args.dim}, MLP 4x); "
        "activations saved for backward + parameter grads (weights and local input excluded)",
        "stack",
        args,
    )


if __name__ == "__main__":
    main()
