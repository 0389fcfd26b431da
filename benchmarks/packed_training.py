"""Packed, token-balanced training steps vs bucketed and padded ones on a mixed set (images + videos).

The set: latents of three resolutions x three lengths plus one-frame images (Wan2.2 VAE strides, patch
1x2x2), one text of ``--text-len`` tokens each. A step is ``--global-batch`` samples over ``--ranks``
data-parallel gloo ranks in ``--micro-steps`` micro-steps per rank: forward + backward of a `WanDiT`
(flow-matching MSE), then the gradients all-reduced. Four ways to batch the same epoch:

- ``bucketed``: `mm_data.GlobalOrderSampler` with one bucket per latent shape (what the trainer does
  without ``data.packing``): every micro-batch stacks samples of one shape, no padding; a bucket's
  leftover samples (fewer than a global batch) are dropped each epoch.
- ``bucket-pad``: the same sampler with one bucket per resolution (aspect), the lengths of a bucket
  padded inside it: every micro-batch zero-padded to its longest sample (images padded to the clips'
  frames), what a trainer that buckets by resolution only does (the issue's "bucketed padding").
- ``padded``: the same sampler with one bucket (any shapes in a global batch), every micro-batch
  zero-padded to its largest latent (what a trainer without buckets or packing does).
- ``packed``: `mm_data.TokenBalancedSampler` (``--token-budget`` tokens per micro-batch, the same micro-steps)
  and `WanDiT`'s packed forward (a list of latents, attention restricted to each sample).

Each rank times its own micro-steps in process CPU seconds (1 intra-op thread per rank: robust to other
jobs on a shared machine); a step lasts as long as its slowest rank (the all-reduce waits for it), so
the step time is the maximum over ranks, and samples/s = samples trained / the sum of step times. Also
printed: the padding fraction (padded tokens / tokens computed), the per-rank token imbalance (slowest
rank's tokens / the mean - 1, averaged over steps), the share of the epoch trained, and wall seconds.
The modes take turns step by step so that background load hits them alike.

    hatch run python benchmarks/packed_training.py                       # 2 ranks, dim 256, 2 blocks
    hatch run python benchmarks/packed_training.py --samples 24 --steps 1 --dim 64 --blocks 1   # smoke
"""

from __future__ import annotations

import argparse
import os
import socket
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from mm_data import GlobalOrderSampler, TokenBalancedSampler, token_imbalance
from wan22_train.model import WanDiT, WanDiTConfig

RESOLUTIONS = [(16, 16), (16, 28), (28, 16)]  # latent h x w: 128x128, 128x224, 224x128 pixels
LENGTHS = [3, 5, 9]  # latent frames: 9, 17, 33 video frames
IMAGE = 1
MODES = ("bucketed", "bucket-pad", "padded", "packed")


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--samples", type=int, default=192, help="samples in the set (a quarter are images; 12 latent shapes)"
    )
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--micro-steps", type=int, default=2, help="micro-steps per rank per step")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument(
        "--steps",
        type=int,
        default=0,
        help="steps timed per mode (default 0: the whole epoch, the same samples)",
    )
    parser.add_argument(
        "--token-budget",
        type=int,
        default=None,
        help="default: micro batch x the largest sample (the padded mode's largest micro-batch)",
    )
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--blocks", type=int, default=2)
    parser.add_argument("--text-len", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def mixed_shapes(count: int, seed: int) -> list[tuple[int, int, int]]:
    """Latent ``(T, h, w)`` of each sample: a quarter images, the rest videos of 3 x 3 shapes."""
    rng = np.random.default_rng(seed)
    shapes = []
    for i in range(count):
        h, w = RESOLUTIONS[rng.integers(len(RESOLUTIONS))]
        frames = IMAGE if i % 4 == 0 else LENGTHS[rng.integers(len(LENGTHS))]
        shapes.append((frames, h, w))
    return shapes


def tokens(shape: tuple[int, int, int]) -> int:
    t, h, w = shape
    return t * (h // 2) * (w // 2)


def model_for(args: argparse.Namespace) -> WanDiT:
    torch.manual_seed(args.seed)
    config = WanDiTConfig(dim=args.dim, num_heads=args.heads, ffn_dim=2 * args.dim, text_dim=64,
                          num_layers=args.blocks, in_dim=16, out_dim=16)  # fmt: skip
    model = WanDiT(config)
    model.init_weights()
    return model


def rank_plans(args, shapes, rank: int) -> dict[str, list[tuple[list[list[int]], list[int], int]]]:
    """Per mode, per step: (this rank's micro-batches, every rank's tokens computed, the step's real tokens)."""
    n, g, k, dp = len(shapes), args.global_batch, args.micro_steps, args.ranks
    shape_ids = {s: i for i, s in enumerate(sorted(set(shapes)))}
    micro = g // (dp * k)
    plans: dict[str, list] = {m: [] for m in MODES}
    resolution_ids = {r: i for i, r in enumerate(sorted({s[1:] for s in shapes}))}
    by_mode = {
        "bucketed": [shape_ids[s] for s in shapes],
        "bucket-pad": [resolution_ids[s[1:]] for s in shapes],
        "padded": [0] * n,
    }
    for mode, buckets in by_mode.items():
        samplers = [
            GlobalOrderSampler(
                n,
                global_batch_size=g,
                dp_rank=r,
                dp_size=dp,
                seed=args.seed,
                micro_batch_size=micro,
                buckets=buckets,
            )  # fmt: skip
            for r in range(dp)
        ]
        for batch in samplers[0].global_batches(0)[: args.steps or None]:
            per_rank = [s.rank_micro_batches(batch) for s in samplers]
            loads = [sum(padded_tokens(shapes, b) for b in mbs) for mbs in per_rank]
            plans[mode].append((per_rank[rank], loads, sum(tokens(shapes[i]) for i in batch)))
    budget = args.token_budget or micro * max(tokens(s) for s in shapes)
    sampler = TokenBalancedSampler([tokens(s) for s in shapes], global_batch_size=g, dp_rank=rank, dp_size=dp,
                                   token_budget=budget, seed=args.seed, micro_steps=k)  # fmt: skip
    all_tokens = [tokens(s) for s in shapes]
    for step in range(min(args.steps or sampler.steps_per_epoch, sampler.steps_per_epoch)):
        plan = sampler.plan(0, step)
        loads = plan.rank_tokens(all_tokens)
        plans["packed"].append((plan.rank(rank), loads, sum(loads)))
    return plans


def padded_tokens(shapes, batch: list[int]) -> int:
    """Tokens a micro-batch computes when padded to its largest latent."""
    t, h, w = (max(shapes[i][d] for i in batch) for d in range(3))
    return len(batch) * tokens((t, h, w))


def micro_step(model: WanDiT, mode: str, shapes, batch: list[int], args, gen: torch.Generator) -> None:
    """Forward + backward of one micro-batch (flow-matching MSE against a random target)."""
    texts = [torch.randn(args.text_len, 64, generator=gen) for _ in batch]
    t = torch.rand(len(batch), generator=gen) * 1000
    if mode == "packed":
        latents = [torch.randn(16, *shapes[i], generator=gen) for i in batch]
        out = model(latents, t, texts)
        loss = sum(F.mse_loss(o, z) for o, z in zip(out, latents, strict=True)) / len(batch)
    else:
        size = [max(shapes[i][d] for i in batch) for d in range(3)]
        latents = torch.zeros(len(batch), 16, *size)
        for row, i in enumerate(batch):
            f, h, w = shapes[i]
            latents[row, :, :f, :h, :w] = torch.randn(16, f, h, w, generator=gen)
        loss = F.mse_loss(model(latents, t, torch.stack(texts)), latents)
    loss.backward()


def worker(rank: int, args: argparse.Namespace, port: int, results) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    torch.manual_seed(args.seed)
    shapes = mixed_shapes(args.samples, args.seed)
    plans = rank_plans(args, shapes, rank)
    model = model_for(args)
    gen = torch.Generator().manual_seed(args.seed + rank)
    cpu = {m: [] for m in MODES}
    wall = dict.fromkeys(MODES, 0.0)
    micro_step(model, "packed", shapes, plans["packed"][0][0][0], args, gen)  # warm up the kernels
    model.zero_grad()
    for step in range(max(len(p) for p in plans.values())):
        turn = step % len(MODES)
        for mode in MODES[turn:] + MODES[:turn]:  # take turns
            if step >= len(plans[mode]):
                continue
            dist.barrier()
            start, start_wall = time.process_time(), time.perf_counter()
            for batch in plans[mode][step][0]:
                micro_step(model, mode, shapes, batch, args, gen)
            cpu[mode].append(time.process_time() - start)
            for p in model.parameters():
                dist.all_reduce(p.grad)
            model.zero_grad()
            wall[mode] += time.perf_counter() - start_wall
    gathered = [None] * args.ranks
    dist.all_gather_object(gathered, cpu)
    if rank == 0:
        results.put((gathered, wall, {m: [(loads, real) for _, loads, real in plans[m]] for m in MODES}))
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def report(args, shapes, gathered, wall, loads) -> None:
    n, g = len(shapes), args.global_batch
    _, per_shape = np.unique([str(s) for s in shapes], return_counts=True)
    _, per_resolution = np.unique([str(s[1:]) for s in shapes], return_counts=True)
    coverage = {
        "bucketed": sum(c // g * g for c in per_shape) / n,
        "bucket-pad": sum(c // g * g for c in per_resolution) / n,
        "padded": n // g * g / n,
        "packed": n // g * g / n,
    }
    print(f"{n} samples ({sum(s[0] == 1 for s in shapes)} images), {len(set(shapes))} latent shapes, "
          f"{min(tokens(s) for s in shapes)}-{max(tokens(s) for s in shapes)} tokens; global batch {g} on "
          f"{args.ranks} ranks x {args.micro_steps} micro-steps; WanDiT dim {args.dim}, {args.blocks} blocks")  # fmt: skip
    print(f"{'mode':10} {'padding':>8} {'imbalance':>10} {'epoch used':>11} {'samples/s':>10} {'x bucketed':>11} "
          f"{'x bucket-pad':>13} {'x padded':>9} {'wall s':>7}")  # fmt: skip
    rate = {}
    for mode in MODES:
        steps = len(gathered[0][mode])
        if not steps:
            raise SystemExit(
                f"{mode}: no global batch in the epoch (a bucket needs {g} samples): raise --samples"
            )
        step_times = [max(rank[mode][s] for rank in gathered) for s in range(steps)]
        rate[mode] = steps * g / sum(step_times)
    for mode in MODES:
        computed = sum(sum(step_loads) for step_loads, _ in loads[mode])
        padding = 1 - sum(real for _, real in loads[mode]) / computed
        imbalance = float(np.mean([token_imbalance(step_loads) for step_loads, _ in loads[mode]]))
        print(f"{mode:10} {padding:8.1%} {imbalance:10.1%} {coverage[mode]:11.1%} {rate[mode]:10.2f} "
              f"{rate[mode] / rate['bucketed']:11.2f} {rate[mode] / rate['bucket-pad']:13.2f} "
              f"{rate[mode] / rate['padded']:9.2f} {wall[mode]:7.1f}")  # fmt: skip


def main() -> None:
    args = parse()
    if args.global_batch % (args.ranks * args.micro_steps):
        raise SystemExit(f"--global-batch {args.global_batch} must divide by ranks x micro-steps")
    results = mp.get_context("fork").SimpleQueue()
    port = free_port()
    procs = [
        mp.get_context("fork").Process(target=worker, args=(r, args, port, results))
        for r in range(args.ranks)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    if any(p.exitcode for p in procs):
        raise SystemExit(f"a rank failed: exit codes {[p.exitcode for p in procs]}")
    gathered, wall, loads = results.get()
    report(args, mixed_shapes(args.samples, args.seed), gathered, wall, loads)


if __name__ == "__main__":
    main()
