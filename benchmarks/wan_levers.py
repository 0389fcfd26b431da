"""Speed and memory levers on one WanDiT training step: eager / compiled x no / selective / full recompute.

One table from one run: each variant is WanDiT with the same weights and inputs, its blocks wrapped by
``mm_trainer.apply_features`` exactly as a run's ``features`` section wraps them (``compile``:
``--compile-backend``, default inductor, each block on its own; ``recompute_plan``: ``selective`` keeps matmul and attention
outputs, ``full`` keeps the block inputs). Step time (fwd + bwd + AdamW) is the median of the timed
steps, process CPU seconds on CPU (1 thread: robust to other jobs; wall seconds beside them), steps
interleaved across variants after one compiling warm-up step each. Peak memory is the most bytes the
step allocates above what is live before it (activations, workspace, gradients), from torch's profiler
memory events on CPU, the allocator's peak on CUDA; one extra step per variant. Both are printed as
ratios to eager without recompute. The matmul skeleton (``wan_step.py``: the same linear layers and
attention calls, nothing else) is timed alongside: "above skeleton" is each variant's time above it,
the part a compiler can fuse; its ratio to eager's is the last column.

    hatch run python benchmarks/wan_levers.py                    # dim 512, 8 heads, 4 blocks, 4096 tokens
    hatch run python benchmarks/wan_levers.py --device cuda --dtype bfloat16 --grid 8 48 64
    hatch run python benchmarks/wan_levers.py --recompute selective   # eager, no recompute + the selective pair
    hatch run python benchmarks/wan_levers.py --compile-backend aot_eager   # the compile path without codegen
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import torch
from mm_config import install_warning_filters
from mm_trainer import apply_features
from wan22_train.model import WanDiT, WanDiTConfig
from wan_step import MatmulSkeleton, Shape, _parser, _step_fn

BLOCKS = ["blocks.{*}"]
VARIANTS = {
    "eager, no recompute": {},
    "eager, selective recompute": {"recompute_modules": BLOCKS, "recompute_policy": "selective"},
    "eager, full recompute": {"recompute_modules": BLOCKS},
    "compiled, no recompute": {"compile_modules": BLOCKS},
    "compiled, selective recompute": {"compile_modules": BLOCKS, "recompute_modules": BLOCKS, "recompute_policy": "selective"},
    "compiled, full recompute": {"compile_modules": BLOCKS, "recompute_modules": BLOCKS},
}  # fmt: skip
BASE, SKELETON = "eager, no recompute", "matmul skeleton (floor)"
RECOMPUTE = ("no", "selective", "full")


def _parse() -> argparse.Namespace:
    parser = _parser(__doc__)
    parser.add_argument(
        "--recompute",
        nargs="+",
        choices=RECOMPUTE,
        default=list(RECOMPUTE),
        help="recompute settings to measure, eager and compiled each (default all; the eager run "
        "without recompute, the ratios' base, always runs); fewer settings compile fewer variants",
    )
    parser.add_argument(
        "--compile-backend",
        default="inductor",
        help="torch.compile backend of the compiled variants (features.compile_plan.backend); aot_eager "
        "traces and partitions as inductor does but generates no code: its times say nothing about a "
        "compiler, it checks the path in seconds instead of a minute of C++ compiles",
    )
    return parser.parse_args()


def _variants(recompute: list[str]) -> dict[str, dict]:
    """The variants a run measures: ``BASE`` and, per chosen recompute setting, eager and compiled."""
    return {
        name: plans
        for name, plans in VARIANTS.items()
        if name == BASE or any(name.endswith(f", {r} recompute") for r in recompute)
    }


def _peak_bytes(fn: Callable[[], object], device: torch.device) -> int:
    """Peak bytes allocated above the start while ``fn`` runs."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - start
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = prof.profiler.kineto_results.events()  # every allocation (+) and free (-), in bytes
    live = peak = 0
    for _, nbytes in sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]"):
        live += nbytes
        peak = max(peak, live)
    return peak


def main() -> None:
    install_warning_filters()  # the project's allowlist, as in the console scripts (torch.compile's own)
    args = _parse()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    torch.set_num_threads(args.threads)
    f, h, w = args.grid
    shape = Shape(
        args.dim, args.heads, args.blocks, args.ffn_dim, args.text_dim, args.text_len, tokens=f * h * w
    )
    config = WanDiTConfig.from_diffusers(
        {"num_attention_heads": args.heads, "attention_head_dim": args.dim // args.heads, "ffn_dim": args.ffn_dim,
         "num_layers": args.blocks, "text_dim": args.text_dim}
    )  # fmt: skip
    torch.manual_seed(0)
    weights = WanDiT(config).state_dict()
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(1, 16, f, 2 * h, 2 * w, generator=gen).to(device, dtype)
    text = torch.randn(1, args.text_len, args.text_dim, generator=gen).to(device, dtype)
    target = torch.randn(hidden.shape, generator=gen).to(device, dtype)
    inputs = (hidden, torch.tensor([500.0], device=device), text)
    steps = {}
    for name, plans in _variants(args.recompute).items():
        model = WanDiT(config)
        model.load_state_dict(weights)
        model = model.to(device, dtype).train()
        if "compile_modules" in plans:
            plans = {**plans, "compile_backend": args.compile_backend}
        apply_features(model, **plans)
        steps[name] = _step_fn(model, model, inputs, target)
    skeleton = MatmulSkeleton(shape).to(device, dtype).train()
    tokens = torch.randn(1, shape.tokens, shape.in_dim * shape.patch_volume, generator=gen).to(device, dtype)
    steps[SKELETON] = _step_fn(skeleton, skeleton, (tokens, text), tokens)

    measured = 1 if device.type == "cuda" else 0
    compile_s = {name: step()[1] for name, step in steps.items()}  # warm-up: compiles the compiled variants
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in steps}
    for _ in range(args.repeats):
        for name, step in steps.items():
            times[name].append(step())
    peaks = {name: _peak_bytes(step, device) for name, step in steps.items()}

    print(
        f"train step fwd+bwd+AdamW, {args.dtype} on {device.type} ({args.threads} thread(s) on CPU): dim "
        f"{args.dim}, {args.heads} heads, {args.blocks} blocks, {shape.tokens} video tokens, {args.text_len} "
        f"text tokens; median of {args.repeats} after 1 warm-up (compiles; backend {args.compile_backend})"
    )
    unit = "cpu s" if measured == 0 else "wall s"
    median = {n: statistics.median(v[measured] for v in values) for n, values in times.items()}
    above_base = median[BASE] - median[SKELETON]
    print(
        f"{'variant':<30} {'median ' + unit:>13} {'wall s':>7} {'time/eager':>10} {'peak MiB':>9} "
        f"{'mem/eager':>9} {'above skel':>10} {'/eager':>7} {'warm-up s':>9}"
    )
    for name, values in times.items():
        wall = statistics.median(v[1] for v in values)
        above = median[name] - median[SKELETON]
        print(
            f"{name:<30} {median[name]:>13.3f} {wall:>7.3f} {median[name] / median[BASE]:>10.3f} "
            f"{peaks[name] / 2**20:>9.0f} {peaks[name] / peaks[BASE]:>9.3f} {above:>10.3f} "
            f"{above / above_base if above_base > 0 else float('nan'):>7.2f} {compile_s[name]:>9.1f}"
        )


if __name__ == "__main__":
    main()
