"""Per-rank attention memory of one ring block for every shipped config: fused kernels vs ``math``.

For each config under ``apps/*/configs`` (tiny ones left out) the block shape follows from the YAML:
tokens = latent frames x latent height x latent width / patch (VAE compression Wan 4 x 8 x 8, TI2V-5B
4 x 16 x 16 from its ``ae`` config, LTX-2 8 x 32 x 32), padded like ``split_for_usp(pad=True)``
(Wan: zigzag ring layout; LTX-2: contiguous); a rank attends ``tokens / ring`` queries against as
many keys per ring step, for ``heads / ulysses`` heads, in the FSDP ``param_dtype``. Without ring
attention (ring size 1) the "block" is the one Ulysses attention call over the whole sequence.

The bytes are :func:`mm_parallel.block_step_bytes` (the model's terms are stated in
``mm_parallel/attention_memory.py``): the peak one block step allocates, forward (kernel + online
softmax merge) and backward (kernel + gradient accumulation), for the kernel a CUDA run selects
(``flash``; ``efficient`` for a padded Ulysses-only call, which torch SDPA runs with a mask), for
``npu`` and for ``math``.

``--validate`` measures what :func:`mm_parallel.ring.forward_step` / ``backward_step`` allocate on a
scaled shape (every allocation, including the kernels' own buffers, from torch's profiler memory
timeline on CPU, or ``torch.cuda`` allocator peaks with ``--device cuda``) and prints measured /
predicted for each kernel that runs here; it exits 1 if one is off by more than 10%.

    hatch run python benchmarks/cp_memory.py                 # the table
    hatch run python benchmarks/cp_memory.py --validate      # + the CPU check (~10 s)
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml
from mm_parallel import BlockShape, block_step_bytes, get_backend
from mm_parallel.ring import backward_step, forward_step

REPO = Path(__file__).resolve().parents[1]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, None: torch.float32}
TOLERANCE = 0.10


@dataclass(frozen=True)
class ConfigShape:
    """What one shipped config asks of a rank's attention."""

    name: str
    tokens: int
    padded: int
    ulysses: int
    ring: int
    block: BlockShape

    @property
    def cuda_kernel(self) -> str:
        return "efficient" if self.ring == 1 and self.padded != self.tokens else "flash"


def _wan_tokens(cfg: dict) -> tuple[int, int, int, int]:
    """(tokens, heads, head_dim, pad multiple) of a Wan2.2 config."""
    models, cache = cfg["model"]["models"], cfg["data"]["dataset"].get("preprocess")
    # a config that trains from the encoder cache keeps the clip sizes and the VAE in its preprocess section
    data = cache["clips"] if cache else cfg["data"]["dataset"]
    ae, dit = (cache or models)["ae"].get("config", {}), models["predictor"]["config"]
    spatial, temporal = ae.get("scale_factor_spatial", 8), ae.get("scale_factor_temporal", 4)
    pt, ph, pw = dit["patch_size"]
    frames = (data["num_frames"] - 1) // temporal + 1
    tokens = (frames // pt) * (data["height"] // spatial // ph) * (data["width"] // spatial // pw)
    ring, ulysses = _layout(cfg)
    return tokens, dit["num_heads"], dit["dim"] // dit["num_heads"], (2 * ring if ring > 1 else 1) * ulysses


def _ltx2_tokens(cfg: dict) -> tuple[int, int, int, int]:
    """(video tokens, heads, head_dim, pad multiple) of an LTX-2 config (video self-attention); a container
    config (a distillation) by its trained transformer, ``model``."""
    model = cfg["model"]["config"] if "config" in cfg["model"] else cfg["model"]["models"]["model"]["config"]
    data = cfg["data"]["dataset"]["preprocess"]
    frames = (data["num_frames"] - 1) // 8 + 1
    tokens = frames * (data["height"] // 32) * (data["width"] // 32)
    ring, ulysses = _layout(cfg)
    return tokens, model["num_attention_heads"], model["attention_head_dim"], ring * ulysses


def _layout(cfg: dict) -> tuple[int, int]:
    parallel = cfg.get("parallel", {})
    return parallel.get("ring_attention_size", 1), parallel.get("ulysses_parallel_size", 1)


def config_shape(path: Path) -> ConfigShape:
    cfg = yaml.safe_load(path.read_text())
    tokens, heads, head_dim, multiple = (_ltx2_tokens if "ltx2" in str(path) else _wan_tokens)(cfg)
    ring, ulysses = _layout(cfg)
    padded = -(-tokens // multiple) * multiple
    dtype = DTYPES[cfg["parallel"].get("fsdp_plan", {}).get("param_dtype")]
    local = padded // ring
    batch = cfg.get("training", {}).get("micro_batch_size", 1)
    block = BlockShape(batch, local, local, heads // ulysses, head_dim, dtype)
    return ConfigShape(f"{path.parent.parent.name}/{path.stem}", tokens, padded, ulysses, ring, block)


#: Apps whose shipped configs run video self-attention under Ulysses / Ring. The VLM app
#: (qwen-vl-train) refuses Ulysses for its LM and has no ring, so it has no CP block to size.
CP_APPS = ("ltx2-train", "wan22-train")


def shipped_configs() -> list[Path]:
    return sorted(
        p
        for app in CP_APPS
        for p in (REPO / "apps" / app / "configs").glob("*.yaml")
        if not p.stem.startswith("tiny")
    )


def _gib(n: float) -> str:
    return f"{n / 2**30:8.3f}"


def print_table() -> None:
    print("per-rank bytes of one attention block step (GiB): forward / backward, from shapes")
    head = f"{'config':<30} {'tokens':>13} {'UxR':>5} {'block [B,Sq,Sk,h,D]':>24} {'cuda':>9}"
    print(
        f"{head} {'fwd':>8} {'bwd':>8} {'npu fwd':>8} {'npu bwd':>8} {'math fwd':>8} {'math bwd':>8} {'fused/math':>10}"
    )
    for path in shipped_configs():
        c = config_shape(path)
        b = c.block
        fused, npu, ref = (block_step_bytes(k, b) for k in (c.cuda_kernel, "npu", "math"))
        ratio = max(fused[0] / ref[0], fused[1] / ref[1])
        shape = f"[{b.batch},{b.q_len},{b.k_len},{b.heads},{b.head_dim}]"
        print(
            f"{c.name:<30} {c.tokens:>6}->{c.padded:<6} {c.ulysses}x{c.ring:<3} {shape:>24} {c.cuda_kernel:>9} "
            f"{_gib(fused[0])} {_gib(fused[1])} {_gib(npu[0])} {_gib(npu[1])} {_gib(ref[0])} {_gib(ref[1])} "
            f"{'1/' + format(1 / ratio, '.0f'):>10}"
        )


# ---------------------------------------------------------------- validation on this machine


def _cpu_peak(fn: Callable[[], None]) -> int:
    """Peak bytes allocated while ``fn`` runs (every CPU allocation: the profiler's memory timeline)."""
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import Action

    with profile(
        activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True
    ) as prof:
        fn()
    live = peak = 0
    for _, action, _, size in sorted(prof._memory_profile().timeline, key=lambda event: event[0]):
        live += size if action == Action.CREATE else -size if action == Action.DESTROY else 0
        peak = max(peak, live)
    return peak


def _cuda_peak(fn: Callable[[], None]) -> int:
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def measure(kernel: str, shape: BlockShape, device: str) -> tuple[int, int]:
    """Measured peak bytes of one forward_step and one backward_step of ``kernel`` on ``shape``."""
    gen = torch.Generator(device).manual_seed(0)
    s, acc = shape, torch.promote_types(shape.dtype, torch.float32)

    def rand(length: int) -> torch.Tensor:
        return torch.randn(s.batch, length, s.heads, s.head_dim, generator=gen, device=device, dtype=s.dtype)

    q, k, v, dout = rand(s.q_len), rand(s.k_len), rand(s.k_len), rand(s.q_len)
    backend, block, scale = get_backend(kernel), (slice(None), slice(None), False), 1 / math.sqrt(s.head_dim)
    out = torch.zeros(q.shape, dtype=acc, device=device)
    lse = torch.full(q.shape[:3], float("-inf"), dtype=acc, device=device)
    peak = _cuda_peak if device == "cuda" else _cpu_peak
    fwd = peak(lambda: forward_step(q, k, v, out, lse, block, None, scale, backend))
    out_q, grads = out.to(s.dtype), [torch.zeros(t.shape, dtype=acc, device=device) for t in (q, k, v)]
    bwd = peak(lambda: backward_step(dout, q, k, v, out_q, lse, *grads, block, None, scale, backend))
    return fwd, bwd


def validate(device: str, shape: BlockShape) -> bool:
    kernels = ("math", "cpu_flash") if device == "cpu" else ("math", "flash", "efficient")
    print(f"\nvalidation on {device}: block {tuple(vars(shape).values())[:5]}, measured / predicted bytes")
    ok = True
    for dtype in (torch.float32, torch.bfloat16):
        for kernel in kernels:
            scaled = BlockShape(shape.batch, shape.q_len, shape.k_len, shape.heads, shape.head_dim, dtype)
            got, want = (
                measure(kernel, scaled, device),
                block_step_bytes(kernel, scaled, threads=torch.get_num_threads()),
            )
            ratios = [g / w for g, w in zip(got, want, strict=True)]
            good = all(abs(r - 1) <= TOLERANCE for r in ratios)
            ok &= good
            print(
                f"{str(dtype)[6:]:<9} {kernel:<10} fwd {got[0] / 2**20:9.2f} / {want[0] / 2**20:9.2f} MiB = {ratios[0]:.3f}"
                f"   bwd {got[1] / 2**20:9.2f} / {want[1] / 2**20:9.2f} MiB = {ratios[1]:.3f}   {'ok' if good else 'OFF'}"
            )
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--validate", action="store_true", help="measure a scaled block here and compare")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (for --validate)")
    parser.add_argument("--shape", type=int, nargs=4, default=(2048, 2048, 2, 128), metavar=("SQ", "SK", "H", "D"),
                        help="the scaled block of --validate (batch 1)")  # fmt: skip
    args = parser.parse_args()
    torch.set_num_threads(1)
    print_table()
    if args.validate:
        return 0 if validate(args.device, BlockShape(1, *args.shape)) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
