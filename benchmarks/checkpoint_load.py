"""Benchmark mm-checkpoint on a ~2 GB safetensors checkpoint (not a test; prints a table).

(a) conversion throughput of ``mm-ckpt convert SRC DST --to dcp`` vs a plain copy of the same bytes;
(b) peak RSS per rank loading into a 2-rank FSDP2-sharded model (each rank reads only its slices)
    vs. the common pattern of loading the full state dict on every rank.

Usage: python benchmarks/checkpoint_load.py [--gb 2.0] [--workdir /tmp/mm_ckpt_bench]
Peak RSS is the VmHWM of each child process (/proc/self/status; it includes file pages mapped by
safetensors). ru_maxrss is not used: Linux carries the parent's high-water mark across fork+exec.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

HIDDEN = 4096  # one layer = HIDDEN x HIDDEN fp32 = 64 MiB


def _model(layers: int):  # noqa: ANN202 - torch imported lazily
    from torch import nn

    return nn.Sequential(*[nn.Linear(HIDDEN, HIDDEN, bias=False) for _ in range(layers)])


def build_checkpoint(path: Path, gb: float) -> int:
    """Write ``gb`` GB of fp32 weights as an HF-style sharded safetensors dir; returns the layer count."""
    import torch
    from safetensors.torch import save_file

    layers = max(2, round(gb * 1e9 / (HIDDEN * HIDDEN * 4)))
    if (path / "model.safetensors.index.json").is_file():
        return layers
    path.mkdir(parents=True, exist_ok=True)
    per_shard, weight_map = 8, {}
    for start in range(0, layers, per_shard):
        name = f"model-{start // per_shard + 1:05d}.safetensors"
        shard = {
            f"{i}.weight": torch.randn(HIDDEN, HIDDEN) for i in range(start, min(layers, start + per_shard))
        }
        save_file(shard, str(path / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, name))
    index = {"metadata": {"total_size": layers * HIDDEN * HIDDEN * 4}, "weight_map": weight_map}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    (path / "config.json").write_text(json.dumps({"layers": layers}))
    return layers


def _copy(src: Path, dst: Path, fsync: bool) -> float:
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    start = time.perf_counter()
    for f in sorted(src.iterdir()):
        shutil.copyfile(f, dst / f.name)
        if fsync:
            with open(dst / f.name, "rb+") as out:
                os.fsync(out.fileno())
    return time.perf_counter() - start


def _convert(src: Path, dst: Path) -> float:
    from mm_checkpoint import convert_to_dcp

    shutil.rmtree(dst, ignore_errors=True)
    start = time.perf_counter()
    convert_to_dcp(src, dst)
    return time.perf_counter() - start


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(mode: str, src: Path, layers: int, world: int) -> list[dict]:
    port = _free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1")  # fmt: skip
        cmd = [sys.executable, __file__, "--worker", mode, "--src", str(src), "--layers", str(layers)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True))
    results = []
    for p in procs:
        out, _ = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"worker {mode} failed with code {p.returncode}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def _vm_hwm_gb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1e6  # kB -> GB
    raise RuntimeError("no VmHWM in /proc/self/status")


def worker(mode: str, src: Path, layers: int) -> None:
    """One rank: build the model on meta, shard it with FSDP2, load weights, report peak RSS."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    with torch.device("meta"):
        model = _model(layers)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    base_gb = _vm_hwm_gb()
    start = time.perf_counter()
    if mode == "sharded":
        from mm_checkpoint import load_checkpoint_with_conversion

        load_checkpoint_with_conversion(model, src)
    else:  # every rank reads the full state dict, then keeps its shard
        from safetensors.torch import load_file
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        model.to_empty(device="cpu")
        full = {}
        for f in sorted(src.glob("*.safetensors")):
            full.update(load_file(str(f)))
        set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True))
        del full
    seconds = time.perf_counter() - start
    dist.barrier()
    print(json.dumps({"rank": dist.get_rank(), "peak_gb": _vm_hwm_gb(), "base_gb": base_gb, "s": seconds}))
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=2.0)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/mm_ckpt_bench"))
    ap.add_argument("--worker", choices=["sharded", "full"])
    ap.add_argument("--src", type=Path)
    ap.add_argument("--layers", type=int)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.src, args.layers)
        from mm_parallel import exit_process

        exit_process(0)  # no interpreter teardown for a gloo thread to race (see mm_parallel.process_exit)
    src = args.workdir / "hf"
    layers = build_checkpoint(src, args.gb)
    size_gb = sum(f.stat().st_size for f in src.iterdir()) / 1e9
    copy_sync = min(_copy(src, args.workdir / "copy", fsync=True) for _ in range(3))
    copy_plain = min(_copy(src, args.workdir / "copy", fsync=False) for _ in range(3))
    convert = min(_convert(src, args.workdir / "dcp") for _ in range(3))
    shutil.rmtree(args.workdir / "copy", ignore_errors=True)
    sharded = _launch("sharded", src, layers, 2)
    full = _launch("full", src, layers, 2)
    shutil.rmtree(args.workdir / "dcp", ignore_errors=True)

    rows = [
        ("checkpoint size", f"{size_gb:.2f} GB ({layers} tensors of {HIDDEN}x{HIDDEN} fp32)"),
        ("plain copy + fsync", f"{copy_sync:.2f} s  ({size_gb / copy_sync:.2f} GB/s)"),
        ("plain copy (no fsync)", f"{copy_plain:.2f} s  ({size_gb / copy_plain:.2f} GB/s)"),
        ("mm-ckpt convert -> dcp", f"{convert:.2f} s  ({size_gb / convert:.2f} GB/s)"),
        ("convert / copy+fsync", f"{copy_sync / convert:.2f}x throughput (target >= 0.5x)"),
        ("convert / copy no fsync", f"{copy_plain / convert:.2f}x throughput"),
    ]
    for name, res in (("sharded (mm-checkpoint)", sharded), ("full state dict per rank", full)):
        rows.append(
            (
                f"peak RSS/rank {name}",
                ", ".join(f"r{r['rank']} {r['peak_gb']:.2f} GB in {r['s']:.1f}s" for r in res),
            )
        )
    rows.append(
        ("  of which before load", f"{max(r['base_gb'] for r in sharded):.2f} GB (torch + meta model)")
    )
    ratio = max(r["peak_gb"] for r in sharded) / max(r["peak_gb"] for r in full)
    rows.append(("sharded / full peak RSS", f"{ratio:.2f}x (target <= 0.6x)"))
    width = max(len(n) for n, _ in rows)
    print("\n".join(f"{n:<{width}}  {v}" for n, v in rows))


if __name__ == "__main__":
    main()
