"""Packed vs padded training steps of a stack of Wan-width blocks on ONE device, on a mixed set (issue 48).

The set is ``packed_training.py``'s (three resolutions x three lengths, a quarter one-frame images), its
latent heights and widths times ``--scale``, cut in order into micro-batches of ``--micro-batch``
samples. Every micro-batch runs forward + backward (flow-matching MSE) of a `WanDiT` of ``--blocks``
blocks two ways, in turn:

- ``padded``: the latents zero-padded to the micro-batch's largest and stacked (``[B, C, F, H, W]``):
  dense attention over the padding too (what a trainer without packing does with mixed shapes);
- ``packed``: the list of latents (`WanDiT`'s packed forward): one token row, attention restricted to
  each sample (:func:`mm_parallel.packed_attention`: on CUDA torch's flash kernel through its
  variable-length entry, on the CPU one dense call per sample).

Times: CUDA wall seconds between synchronisations, CPU process seconds (1 intra-op thread by default);
the sum over micro-batches of each round, fastest and median round. Prints the attention kernel, the
padding fraction and samples/s of each mode, and packed / padded.

    python benchmarks/packed_step.py --device cuda --dtype bfloat16 --scale 2          # Wan-14B width
    python benchmarks/packed_step.py --dim 64 --heads 2 --ffn-dim 128 --text-dim 32 --blocks 1 --samples 4
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from mm_parallel.attention_choice import ring_kernel
from packed_training import mixed_shapes, tokens
from wan22_train.model import WanDiT, WanDiTConfig

Shape = tuple[int, int, int]


#: Integer options and their defaults: the model at Wan-14B width, the set, the timing.
INT_OPTIONS = {
    "dim": (5120, "model width"), "heads": (40, "attention heads"), "ffn-dim": (13824, "feed-forward width"),
    "blocks": (2, "Wan blocks"), "text-dim": (4096, "text embedding width"), "text-len": (512, "text tokens"),
    "samples": (16, "samples of the mixed set (a quarter images)"), "micro-batch": (4, "samples per micro-batch"),
    "scale": (1, "latent height and width times this"), "repeats": (2, "timed rounds over every micro-batch"),
    "warmup": (1, "untimed rounds"), "threads": (1, "torch intra-op threads on CPU"), "seed": (0, "shapes, data"),
}  # fmt: skip


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    for name, (default, help_text) in INT_OPTIONS.items():
        parser.add_argument(f"--{name}", type=int, default=default, help=f"{help_text} (default {default})")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    return parser.parse_args()


def micro_step(
    model: WanDiT, packed: bool, shapes: list[Shape], args: argparse.Namespace
) -> Callable[[], None]:
    """One micro-batch's forward + backward, its inputs made once on the device."""
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    gen = torch.Generator().manual_seed(args.seed)
    latents = [torch.randn(16, *s, generator=gen).to(device, dtype) for s in shapes]
    texts = [torch.randn(args.text_len, args.text_dim, generator=gen).to(device, dtype) for _ in shapes]
    t = (torch.rand(len(shapes), generator=gen) * 1000).to(device)
    if packed:

        def step() -> None:
            out = model(latents, t, texts)
            sum(F.mse_loss(o, z) for o, z in zip(out, latents, strict=True)).backward()

        return step
    size = [max(s[d] for s in shapes) for d in range(3)]
    padded = torch.zeros(len(shapes), 16, *size, device=device, dtype=dtype)
    for row, (z, (f, h, w)) in enumerate(zip(latents, shapes, strict=True)):
        padded[row, :, :f, :h, :w] = z
    stacked = torch.stack(texts)
    return lambda: F.mse_loss(model(padded, t, stacked), padded).backward()


def timed_round(steps: list[Callable[[], None]], device: torch.device) -> float:
    """Seconds of every micro-batch's step once (CUDA: wall between synchronisations; CPU: process time)."""

    def now() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            return time.perf_counter()
        return time.process_time()

    start = now()
    for step in steps:
        step()
    return now() - start


def main() -> None:
    args = parse()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    config = WanDiTConfig(dim=args.dim, num_heads=args.heads, ffn_dim=args.ffn_dim, text_dim=args.text_dim,
                          num_layers=args.blocks, in_dim=16, out_dim=16)  # fmt: skip
    model = WanDiT(config)
    model.init_weights()
    model = model.to(args.device, getattr(torch, args.dtype)).train()
    shapes = [(f, h * args.scale, w * args.scale) for f, h, w in mixed_shapes(args.samples, args.seed)]
    batches = [shapes[i : i + args.micro_batch] for i in range(0, len(shapes), args.micro_batch)]
    real = sum(tokens(s) for s in shapes)
    padded_tokens = sum(len(b) * tokens(tuple(max(s[d] for s in b) for d in range(3))) for b in batches)
    steps = {
        mode: [micro_step(model, mode == "packed", b, args) for b in batches] for mode in ("padded", "packed")
    }
    device = torch.device(args.device)
    for _ in range(args.warmup):
        for mode_steps in steps.values():
            timed_round(mode_steps, device)
    times: dict[str, list[float]] = {mode: [] for mode in steps}
    for _ in range(args.repeats):  # the modes take turns, so that load hits both alike
        for mode, mode_steps in steps.items():
            times[mode].append(timed_round(mode_steps, device))
    kernel = ring_kernel(device)
    varlen = "its varlen entry" if kernel.varlen_forward is not None else "one dense call per sample"
    unit = "wall s" if args.device.startswith("cuda") else "cpu s"
    print(f"packed vs padded on one {args.device} ({args.dtype}): WanDiT dim {args.dim}, {args.heads} heads, ffn "
          f"{args.ffn_dim}, {args.blocks} blocks; {len(shapes)} samples ({sum(s[0] == 1 for s in shapes)} images, "
          f"{min(tokens(s) for s in shapes)}-{max(tokens(s) for s in shapes)} tokens) in {len(batches)} micro-batches "
          f"of {args.micro_batch}; packed attention kernel: {kernel.name} ({varlen}); {args.repeats} rounds "
          f"after {args.warmup} warm-up")  # fmt: skip
    print(
        f"{'mode':8} {'tokens':>8} {'padding':>8} {'min ' + unit:>11} {'med ' + unit:>11} {'samples/s':>10}"
    )
    rate = {}
    for mode, seconds in times.items():
        computed = padded_tokens if mode == "padded" else real
        rate[mode] = len(shapes) / min(seconds)
        print(f"{mode:8} {computed:>8} {1 - real / computed:>8.1%} {min(seconds):>11.3f} "
              f"{statistics.median(seconds):>11.3f} {rate[mode]:>10.2f}")  # fmt: skip
    print(f"packed / padded samples/s: {rate['packed'] / rate['padded']:.2f}")


if __name__ == "__main__":
    main()
