"""One training step (forward + backward + AdamW) of WanDiT vs diffusers' WanTransformer3DModel.

Both models hold identical weights (diffusers' random init mapped through the `wan2_2` key map) and get
identical inputs; steps alternate between the two models so background load hits both alike. On CPU
the times are process CPU seconds (with 1 intra-op thread this is the step's compute, robust to other
jobs on a shared machine; wall seconds are printed beside them); on CUDA they are wall seconds between
device synchronisations. Prints the median step time of each model and the ratio ours / diffusers
(target <= 0.9).

Because both models do the same arithmetic, the table also times a third model, the matmul skeleton:
the same linear layers and attention calls on the same shapes with every norm, modulation, RoPE,
activation and residual deleted. No implementation that runs this arithmetic through the same matmul
and attention kernels is faster than the skeleton, so `skeleton / diffusers` is the best ratio
reachable here; if it is above the target, the target needs other hardware, precision or kernels,
not a different model definition. The GFLOP/s column is the
step's matmul + attention arithmetic (counted from the shapes; flash-attention backward recomputes
the scores, so attention counts 7 GEMMs: 2 forward, 5 backward) over the median time; on a GPU whose
dense peak is known (``PEAK_TFLOPS``, or ``--peak-tflops``) a last line gives each model's MFU, that
rate over the peak (at Wan-14B width: ``--dim 5120 --heads 40 --ffn-dim 13824``).

    hatch run python benchmarks/wan_step.py                        # dim 512, 8 heads, 4 blocks, 4096 tokens
    hatch run python benchmarks/wan_step.py --dtype bfloat16
    hatch run python benchmarks/wan_step.py --device cuda --dtype bfloat16 --grid 8 48 64   # a GPU
    python benchmarks/wan_step.py --device cuda --dtype bfloat16 --dim 5120 --heads 40 --ffn-dim 13824 \
        --blocks 2 --grid 21 30 52            # MFU of Wan-14B-width blocks at 480p x 81 frames (32760 tokens)
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from diffusers import WanTransformer3DModel
from torch import nn
from wan22_train.key_maps import diffusers_to_native
from wan22_train.model import WanDiT, WanDiTConfig


def _parser(doc: str | None = __doc__) -> argparse.ArgumentParser:
    """The shape, device and timing options shared by the Wan step benchmarks."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads on CPU (shared machine: 1)"
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument(
        "--dtype", default="float32", choices=("float32", "bfloat16"), help="parameters and inputs"
    )
    return parser


#: Dense (no sparsity) peak TFLOP/s by (device name part, dtype), from the vendors' data sheets; the first
#: part found in ``torch.cuda.get_device_name()`` wins (the PCIe H100 before the SXM one).
PEAK_TFLOPS = {
    ("H100 PCIe", "bfloat16"): 756.0,
    ("H100", "bfloat16"): 989.4,
    ("H200", "bfloat16"): 989.4,
    ("A100", "bfloat16"): 312.0,
}


def _parse() -> argparse.Namespace:
    parser = _parser()
    parser.add_argument(
        "--peak-tflops", type=float, default=None, help="the device's dense peak for the MFU line "
        "(default: PEAK_TFLOPS by the CUDA device's name; no MFU line when unknown)",
    )  # fmt: skip
    return parser.parse_args()


def peak_tflops(device: torch.device, dtype: str, given: float | None) -> tuple[float, str] | None:
    """The peak the MFU line divides by and where it comes from, or None when unknown."""
    if given is not None:
        return given, "--peak-tflops"
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for (part, peak_dtype), peak in PEAK_TFLOPS.items():
        if part in name and peak_dtype == dtype:
            return peak, f"{name} {dtype} dense"
    return None


@dataclass(frozen=True)
class Shape:
    """The benchmarked model and input shape (post-patch tokens)."""

    dim: int
    heads: int
    blocks: int
    ffn_dim: int
    text_dim: int
    text_len: int
    tokens: int
    in_dim: int = 16
    patch_volume: int = 4

    def step_flops(self) -> float:
        """Matmul + attention FLOPs of one training step (multiply-add = 2).

        A linear layer costs its forward GEMM 3 times (forward, input grad, weight grad), twice when its
        input needs no grad (patch and text embeddings). Attention's score and value GEMMs cost 7/2 of
        their forward: flash-attention backward recomputes the scores.
        """
        s, t, d, f = self.tokens, self.text_len, self.dim, self.ffn_dim
        block_linear = 2 * (6 * s * d * d + 2 * t * d * d + 2 * s * d * f)  # q k v o, cross q o | k v, ffn
        block_attention = 2 * (2 * s * s * d + 2 * s * t * d)  # self, cross: QK^T and PV
        head = 2 * s * d * self.in_dim * self.patch_volume
        leaf_linear = 2 * s * self.in_dim * self.patch_volume * d + 2 * t * (self.text_dim * d + d * d)
        return self.blocks * (3 * block_linear + 3.5 * block_attention) + 3 * head + 2 * leaf_linear


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
    dtype = getattr(torch, args.dtype)
    # ours computes its norms and modulation in fp32 whatever its parameters' dtype (wan_dit), so a
    # plain cast; the reference as diffusers loads it for that dtype (its fp32 modules stay fp32)
    return _as_loaded(reference, dtype).to(args.device).train(), ours.to(args.device, dtype).train()


def _as_loaded(model: WanTransformer3DModel, dtype: torch.dtype) -> WanTransformer3DModel:
    """``model`` as ``from_pretrained(torch_dtype=dtype)`` gives it: the modules its class lists in
    ``_keep_in_fp32_modules`` stay float32 (a plain ``.to(dtype)`` would cast them too)."""
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        return WanTransformer3DModel.from_pretrained(tmp, torch_dtype=dtype)


def _timer(device: torch.device) -> Callable[[], tuple[float, float]]:
    def now() -> tuple[float, float]:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.process_time(), time.perf_counter()

    return now


def _step_fn(
    model: torch.nn.Module, call: Callable, inputs: tuple, target: torch.Tensor
) -> Callable[[], tuple[float, float]]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    now = _timer(target.device)

    def step() -> tuple[float, float]:
        cpu, wall = now()
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(call(*inputs), target)
        loss.backward()
        optimizer.step()
        cpu_end, wall_end = now()
        return cpu_end - cpu, wall_end - wall

    return step


class MatmulSkeleton(nn.Module):
    """The Wan DiT's linear layers and attention calls on the same shapes, and nothing else.

    No norms, modulation, RoPE, activations or residuals: the time of its training step is what the
    matmul and attention kernels alone cost, a floor for any implementation of the model.
    """

    def __init__(self, shape: Shape) -> None:
        super().__init__()
        d = shape.dim
        self.heads = shape.heads
        self.patch = nn.Linear(shape.in_dim * shape.patch_volume, d)
        self.text = nn.Sequential(nn.Linear(shape.text_dim, d), nn.Linear(d, d))
        names = ("q", "k", "v", "o", "cross_q", "cross_k", "cross_v", "cross_o")
        self.blocks = nn.ModuleList(
            nn.ModuleDict(
                {name: nn.Linear(d, d) for name in names}
                | {"ffn_in": nn.Linear(d, shape.ffn_dim), "ffn_out": nn.Linear(shape.ffn_dim, d)}
            )
            for _ in range(shape.blocks)
        )
        self.head = nn.Linear(d, shape.in_dim * shape.patch_volume)

    def _attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        q, k, v = (t.unflatten(-1, (self.heads, -1)).transpose(1, 2) for t in (q, k, v))
        return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2)

    def forward(self, tokens: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        """tokens: [B, S, in_dim * patch]; text: [B, L, text_dim] -> [B, S, in_dim * patch]."""
        x, context = self.patch(tokens), self.text(text)
        for b in self.blocks:
            x = b["o"](self._attention(b["q"](x), b["k"](x), b["v"](x)))
            x = b["cross_o"](self._attention(b["cross_q"](x), b["cross_k"](context), b["cross_v"](context)))
            x = b["ffn_out"](b["ffn_in"](x))
        return self.head(x)


REFERENCE, OURS, SKELETON = "diffusers WanTransformer3DModel", "wan22_train WanDiT", "matmul skeleton (floor)"


def main() -> None:
    args = _parse()
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    torch.set_num_threads(args.threads)
    reference, ours = _models(args)
    f, h, w = args.grid
    shape = Shape(
        args.dim, args.heads, args.blocks, args.ffn_dim, args.text_dim, args.text_len, tokens=f * h * w
    )
    skeleton = MatmulSkeleton(shape).to(device, dtype).train()
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(1, 16, f, 2 * h, 2 * w, generator=gen)
    text = torch.randn(1, args.text_len, args.text_dim, generator=gen)
    target = torch.randn(hidden.shape, generator=gen).to(device, dtype)
    inputs = (hidden.to(device, dtype), torch.tensor([500.0], device=device), text.to(device, dtype))
    tokens = hidden.new_empty(1, shape.tokens, shape.in_dim * shape.patch_volume).normal_(generator=gen)
    steps = {
        REFERENCE: _step_fn(reference, lambda *a: reference(*a, return_dict=False)[0], inputs, target),
        OURS: _step_fn(ours, ours, inputs, target),
        SKELETON: _step_fn(
            skeleton, skeleton, (tokens.to(device, dtype), inputs[2]), tokens.to(device, dtype)
        ),
    }
    measured = 1 if device.type == "cuda" else 0  # CUDA: wall time; CPU: process CPU time
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in steps}
    for i in range(args.warmup + args.repeats):
        for name, step in steps.items():
            elapsed = step()
            if i >= args.warmup:
                times[name].append(elapsed)

    flops = shape.step_flops()
    where = f"{args.threads} thread(s)" if device.type == "cpu" else str(device)
    print(
        f"train step fwd+bwd+AdamW, {args.dtype} on {device.type} ({where}): dim {args.dim}, {args.heads} "
        f"heads, {args.blocks} blocks, ffn {args.ffn_dim}, {shape.tokens} video tokens ({f}x{h}x{w}), "
        f"{args.text_len} text tokens, {flops / 1e9:.0f} GFLOP of matmul + attention; median of "
        f"{args.repeats} after {args.warmup} warm-up"
    )
    unit = "cpu s" if measured == 0 else "wall s"
    print(
        f"{'model':<32} {'median ' + unit:>13} {'min':>7} {'max':>7} {'wall s':>7} {'GFLOP/s':>8} {'/ diffusers':>11}"
    )
    medians = {name: statistics.median(v[measured] for v in values) for name, values in times.items()}
    for name, values in times.items():
        chosen = [v[measured] for v in values]
        wall = statistics.median(v[1] for v in values)
        print(
            f"{name:<32} {medians[name]:>13.3f} {min(chosen):>7.3f} {max(chosen):>7.3f} {wall:>7.3f} "
            f"{flops / medians[name] / 1e9:>8.1f} {medians[name] / medians[REFERENCE]:>11.3f}"
        )
    ratio = medians[OURS] / medians[REFERENCE]
    floor = medians[SKELETON] / medians[REFERENCE]
    above = {name: medians[name] - medians[SKELETON] for name in (OURS, REFERENCE)}
    print(
        f"time above the skeleton (norms, modulation, RoPE, activations, residuals, glue): ours "
        f"{above[OURS]:.3f} s, diffusers {above[REFERENCE]:.3f} s"
        + (f" ({above[OURS] / above[REFERENCE]:.2f}x)" if above[REFERENCE] > 0 else "")
    )
    print(
        f"ratio ours / diffusers: {ratio:.3f}  (target <= 0.9; the same kernels cannot beat the skeleton's "
        f"{floor:.3f} here)"
    )
    peak = peak_tflops(device, args.dtype, args.peak_tflops)
    if peak is not None:
        mfu = ", ".join(f"{name} {flops / medians[name] / 1e12 / peak[0]:.1%}" for name in medians)
        print(f"MFU (of {peak[0]:g} TFLOP/s, {peak[1]}): {mfu}")


if __name__ == "__main__":
    main()
