"""LoRA vs full fine-tuning of WanDiT: peak memory and time of a training step, one config, one run.

Three modes on the same weights, inputs and shapes, each in its own child process (so that one mode's
allocations never count for another's peak):

- ``full``: every parameter trains (AdamW over all of them);
- ``lora``: rank-r adapters on every attention projection and both FFN layers of each block, injected
  through ``mm_trainer.inject_lora`` (the trainer's own path); AdamW over the adapters only;
- ``lora, bf16 base``: the same with the frozen base cast to bf16 (adapters stay fp32; the step
  computes in bf16), what ``model.models.<name>.dtype: bf16`` gives in a run.

A step is forward + backward + AdamW on an MSE loss. Time: median process CPU seconds per step with one
intra-op thread (robust to other jobs on a shared machine; wall seconds beside it), or wall seconds
between synchronisations on CUDA. Memory: the training state counted exactly (parameters, gradients,
AdamW moments) and the measured peak: on CPU the child's peak RSS above its RSS before the model was
built, on CUDA ``max_memory_allocated`` (model, inputs and steps).

    hatch run python benchmarks/lora_step.py                         # dim 1024, 8 blocks, 512 tokens
    hatch run python benchmarks/lora_step.py --rank 64 --grid 4 32 32
    hatch run python benchmarks/lora_step.py --device cuda --dim 1536 --blocks 8 --grid 8 30 52
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from types import SimpleNamespace

import torch

MODES = ("full", "lora", "lora, bf16 base")
TARGETS = ["blocks.{*}.self_attn.?", "blocks.{*}.cross_attn.?", "blocks.{*}.ffn.0", "blocks.{*}.ffn.2"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--ffn-dim", type=int, default=4096)
    parser.add_argument("--text-dim", type=int, default=1024)
    parser.add_argument("--text-len", type=int, default=128)
    parser.add_argument("--grid", type=int, nargs=3, default=(2, 16, 16), help="post-patch F H W")
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank (alpha = rank)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads on CPU (shared machine: 1)"
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)  # a child process's one mode
    return parser.parse_args(argv)


def _rss_bytes() -> int:
    """Current resident set size (Linux /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _model(args: argparse.Namespace, mode: str, device: torch.device) -> tuple[torch.nn.Module, torch.dtype]:
    from mm_trainer import ModelContainer, inject_lora
    from wan22_train.model import WanDiT, WanDiTConfig

    torch.manual_seed(0)
    config = WanDiTConfig(
        dim=args.dim, num_heads=args.heads, ffn_dim=args.ffn_dim, text_dim=args.text_dim,
        num_layers=args.blocks, in_dim=16, out_dim=16,
    )  # fmt: skip
    dtype = torch.bfloat16 if mode == "lora, bf16 base" else torch.float32
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # built in its dtype: no fp32 copy on the way to the peak
    try:
        model = WanDiT(config).to(device)
    finally:
        torch.set_default_dtype(default)
    if mode != "full":
        container = ModelContainer({"predictor": model}, trainable=("predictor",))
        lora = SimpleNamespace(target_modules=TARGETS, rank=args.rank, alpha=float(args.rank))
        inject_lora(container, {"predictor": lora}).init_adapters(container, seed=0)
        model.to(device)
    return model.train(), dtype


def measure(args: argparse.Namespace) -> dict:
    """Run ``args.mode`` and return its numbers (a child process prints them as JSON). Sets torch's
    intra-op threads to ``args.threads``."""
    import mm_trainer  # noqa: F401  (these imports before the baseline: no mode's peak counts them)
    import peft  # noqa: F401
    import wan22_train.model  # noqa: F401

    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    base_rss = _rss_bytes()
    model, dtype = _model(args, args.mode, device)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5)
    f, h, w = args.grid
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(1, 16, f, 2 * h, 2 * w, generator=gen).to(device, dtype)
    text = torch.randn(1, args.text_len, args.text_dim, generator=gen).to(device, dtype)
    target = torch.randn(hidden.shape, generator=gen).to(device, dtype)
    timestep = torch.tensor([500.0], device=device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for i in range(args.warmup + args.repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        cpu, wall = time.process_time(), time.perf_counter()
        optimizer.zero_grad(set_to_none=False)
        loss = torch.nn.functional.mse_loss(model(hidden, timestep, text).float(), target.float())
        loss.backward()
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= args.warmup:
            times.append((time.process_time() - cpu, time.perf_counter() - wall))
    every = list(model.parameters())
    state = sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values() if t.dim())
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
    else:  # ru_maxrss is in KiB on Linux
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base_rss
    return {
        "trainable": sum(p.numel() for p in params),
        "frozen": sum(p.numel() for p in every) - sum(p.numel() for p in params),
        "state_bytes": sum(p.numel() * p.element_size() for p in every)
        + sum(p.numel() * p.element_size() for p in params)  # gradients
        + state,
        "peak_bytes": peak,
        "cpu_s": statistics.median(t[0] for t in times),
        "wall_s": statistics.median(t[1] for t in times),
    }


def _run_mode(mode: str, argv: list[str]) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, *argv, "--mode", mode], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise SystemExit(f"mode {mode!r} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def report(args: argparse.Namespace, results: dict[str, dict]) -> str:
    """The table of ``results`` (one :func:`measure` per mode, ``full`` among them)."""
    f, h, w = args.grid
    cuda = args.device.startswith("cuda")
    peak_name = "peak alloc" if cuda else "peak RSS +"
    time_name = "wall s" if cuda else "cpu s"
    lines = [
        f"WanDiT train step fwd+bwd+AdamW on {args.device} ({args.threads} thread(s) on CPU): dim {args.dim}, "
        f"{args.heads} heads, {args.blocks} blocks, ffn {args.ffn_dim}, {f * h * w} video tokens, "
        f"{args.text_len} text tokens; LoRA rank {args.rank} on {len(TARGETS)} patterns "
        f"(10 linears per block); median of {args.repeats} after {args.warmup} warm-up",
        f"{'mode':<16} {'trainable':>11} {'frozen':>11} {'train state MB':>15} {peak_name + ' MB':>14} "
        f"{time_name:>8} {'wall s':>7} {'memory / full':>14} {'time / full':>12}",
    ]
    full = results["full"]
    for mode, r in results.items():
        step = r["wall_s"] if cuda else r["cpu_s"]
        full_step = full["wall_s"] if cuda else full["cpu_s"]
        memory = r["peak_bytes"] / full["peak_bytes"] if full["peak_bytes"] > 0 else float("nan")
        lines.append(
            f"{mode:<16} {r['trainable']:>11,} {r['frozen']:>11,} {r['state_bytes'] / 2**20:>15.1f} "
            f"{r['peak_bytes'] / 2**20:>14.1f} {step:>8.3f} {r['wall_s']:>7.3f} "
            f"{memory:>14.3f} {step / full_step:>12.3f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.mode is not None:
        print(json.dumps(measure(args)))
        return
    print(report(args, {mode: _run_mode(mode, argv) for mode in MODES}))


if __name__ == "__main__":
    main()
