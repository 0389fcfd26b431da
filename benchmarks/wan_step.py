"""One training step (forward + backward + AdamW) of WanDiT vs diffusers' WanTransformer3DModel on CPU.

Both models hold identical weights (diffusers' random init mapped through the `wan2_2` key map) and get
identical inputs; steps alternate between the two models so background load hits both alike. Times are
process CPU seconds (with 1 intra-op thread this is the step's compute, robust to other jobs on a shared
machine); wall seconds are printed beside them. Prints a table with the median step time of each and
the ratio ours / diffusers (target <= 0.9).

    hatch run python benchmarks/wan_step.py                       # dim 512, 8 heads, 4 blocks, 4096 tokens
    hatch run python benchmarks/wan_step.py --grid 4 16 32 --repeats 3   # 2048 tokens
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from diffusers import WanTransformer3DModel
from wan22_train.key_maps import diffusers_to_native
from wan22_train.model import WanDiT, WanDiTConfig


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--ffn-dim", type=int, default=1536)
    parser.add_argument("--text-dim", type=int, default=4096)
    parser.add_argument("--text-len", type=int, default=512)
    parser.add_argument(
        "--grid", type=int, nargs=3, default=(4, 32, 32), help="post-patch F H W (tokens = F*H*W)"
    )
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (shared machine: 1)")
    return parser.parse_args()


def _models(args: argparse.Namespace) -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    diffusers_config = {
        "num_attention_heads": args.heads,
        "attention_head_dim": args.dim // args.heads,
        "ffn_dim": args.ffn_dim,
        "num_layers": args.blocks,
        "text_dim": args.text_dim,
    }
    reference = WanTransformer3DModel(**diffusers_config)
    ours = WanDiT(WanDiTConfig.from_diffusers(diffusers_config))
    ours.load_state_dict(diffusers_to_native(reference.state_dict()), strict=True)
    return reference.train(), ours.train()


def _step_fn(
    model: torch.nn.Module, call: Callable, inputs: tuple, target: torch.Tensor
) -> Callable[[], tuple[float, float]]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def step() -> tuple[float, float]:
        cpu, wall = time.process_time(), time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(call(*inputs), target)
        loss.backward()
        optimizer.step()
        return time.process_time() - cpu, time.perf_counter() - wall

    return step


def main() -> None:
    args = _parse()
    torch.set_num_threads(args.threads)
    reference, ours = _models(args)
    f, h, w = args.grid
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(1, 16, f, 2 * h, 2 * w, generator=gen)
    inputs = (hidden, torch.tensor([500.0]), torch.randn(1, args.text_len, args.text_dim, generator=gen))
    target = torch.randn(hidden.shape, generator=gen)
    steps = {
        "diffusers WanTransformer3DModel": _step_fn(
            reference, lambda *a: reference(*a, return_dict=False)[0], inputs, target
        ),
        "wan22_train WanDiT": _step_fn(ours, ours, inputs, target),
    }
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in steps}
    for i in range(args.warmup + args.repeats):
        for name, step in steps.items():
            elapsed = step()
            if i >= args.warmup:
                times[name].append(elapsed)

    medians = {name: statistics.median(cpu for cpu, _ in values) for name, values in times.items()}
    tokens = f * h * w
    print(
        f"train step fwd+bwd+AdamW, fp32 CPU, {args.threads} thread(s): dim {args.dim}, {args.heads} heads, "
        f"{args.blocks} blocks, ffn {args.ffn_dim}, {tokens} video tokens ({f}x{h}x{w}), "
        f"{args.text_len} text tokens, median of {args.repeats} after {args.warmup} warm-up"
    )
    print(f"{'model':<34} {'median cpu s':>12} {'min cpu s':>10} {'max cpu s':>10} {'median wall s':>13}")
    for name, values in times.items():
        cpu = [c for c, _ in values]
        wall = statistics.median(w for _, w in values)
        print(f"{name:<34} {medians[name]:>12.3f} {min(cpu):>10.3f} {max(cpu):>10.3f} {wall:>13.3f}")
    ratio = medians["wan22_train WanDiT"] / medians["diffusers WanTransformer3DModel"]
    print(f"ratio ours / diffusers: {ratio:.3f}  (target <= 0.9)")


if __name__ == "__main__":
    main()
