"""Latent-cache preprocessing throughput (``mm_data.cache_dataset``, the apps' ``preprocess`` path):

1. clips/s on 1 and on 2 ranks (``torchrun --nproc-per-node 1|2``, one thread per rank, clips decoded in
   the main process): the ranks split the clips, so 2 ranks on 2 free cores should reach ~2x;
2. clips/s on 1 rank with the clips decoded in 1 DataLoader worker vs in the main process (the worker
   decodes the next clip while the encoders run);
3. files opened per training step reading the cache (``PrecomputedLatentDataset`` + ``build_dataloader``),
   sharded vs the per-file layout, counted with ``strace -e openat`` on the reading process;
4. with ``--integrity`` (alone): what the cache's integrity checks cost per GB, the price of every
   preprocess run hashing every clip (``mm_data.clip_digests``: SHA-256 of the bytes, in 1 and 2
   processes, with no records yet and with records to verify) and verifying every shard
   (``mm_data.shards.verify_shard`` through ``cache_plan.verify_files``: each tensor's CRC-32, in 1 and 2
   threads), over ``--integrity-gb`` GB of files just written (in the page cache: a cold read from disk
   adds the disk's time, which usually bounds it).

The work per clip is real: synthetic 480x832 H.264 clips (``--source-frames`` frames, keyframe every 16)
decoded and resized to ``--frames`` x ``--height`` x ``--width``, encoded by a randomly initialised
diffusers ``AutoencoderKLWan`` (``--vae-dim`` base channels) and a small transformers ``UMT5EncoderModel``
on each caption, so that decode + encode dominate what a rank does per clip (model loading, planning and
packing shards are outside the timed encode phase). Rates are over the encode phase of the slowest rank.
Every figure is measured here, in this run; print ``uptime``'s load beside it (a shared machine's other
work slows the 2-rank run most). Usage::

    python benchmarks/preprocess_throughput.py [--clips 16] [--frames 17] [--height 128] [--width 224]
    python benchmarks/preprocess_throughput.py --integrity [--integrity-gb 1]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

READ = {"frame_offset": "start", "fps": None}


def _encoders(vae_dim: int):
    """A random Wan VAE and UMT5 (seeded: every rank builds the same ones)."""
    import torch
    from diffusers import AutoencoderKLWan
    from transformers import UMT5Config, UMT5EncoderModel

    torch.manual_seed(0)
    vae = AutoencoderKLWan(base_dim=vae_dim, z_dim=16, dim_mult=[1, 2, 2], num_res_blocks=1,
                           temperal_downsample=[False, True]).eval()  # fmt: skip
    text = UMT5EncoderModel(
        UMT5Config(vocab_size=256, d_model=256, d_kv=32, d_ff=512, num_layers=4, num_heads=8)
    ).eval()
    return vae, text


def rank_run(args: argparse.Namespace) -> None:
    """One rank of a preprocess run (under torchrun): encode ``--data`` into ``--out``; rank 0 writes the report."""
    import torch
    import torch.distributed as dist
    from mm_data import VideoTextDataset, cache_dataset

    torch.set_num_threads(1)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        dist.init_process_group("gloo")
    dataset = VideoTextDataset(args.data, num_frames=args.frames, height=args.height, width=args.width,
                               frame_rule="4k+1", **READ)  # fmt: skip
    vae, text = _encoders(args.vae_dim)

    @torch.no_grad()
    def encode(item: dict) -> dict:
        latents = vae.encode(item["video"][None]).latent_dist.mode()[0]
        ids = torch.tensor([[ord(c) % 256 for c in item["prompt"][:64].ljust(64)]])  # 64 tokens
        return {"latents": latents, "prompt_embeds": text(input_ids=ids).last_hidden_state[0]}

    report = cache_dataset(dataset, encode, args.out, identity={"bench": args.vae_dim}, shard_size=8,
                           num_workers=args.decode_workers, progress=False)  # fmt: skip
    if report.rank == 0:
        summary = {
            "computed": len(report.computed),
            "encode_s": report.encode_seconds,
            "rate": report.clips_per_second,
        }
        Path(args.report).write_text(json.dumps(summary))


def count_opens(args: argparse.Namespace) -> None:
    """Read ``--steps`` training steps of ``--batch`` samples from the cache ``--out`` (run under strace)."""
    from mm_data import PrecomputedLatentDataset, build_dataloader

    dataset = PrecomputedLatentDataset(args.out, required=["latents"])
    loader = build_dataloader(dataset, global_batch_size=args.batch, dp_rank=0, dp_size=1, seed=0)
    steps = 0
    while steps < args.steps:  # epochs until --steps steps are read
        for _ in loader:
            steps += 1
            if steps == args.steps:
                break


def _torchrun(nproc: int, data: Path, out: Path, decode_workers: int, args: argparse.Namespace) -> dict:
    report = out.with_suffix(".json")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", __file__,
           "--rank-run", "--data", str(data), "--out", str(out), "--report", str(report),
           "--decode-workers", str(decode_workers), "--frames", str(args.frames), "--height", str(args.height),
           "--width", str(args.width), "--vae-dim", str(args.vae_dim)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    return json.loads(report.read_text())


def _cache_opens(cache: Path, steps: int, batch: int) -> int:
    """``openat`` calls on ``cache``'s safetensors files by a process reading ``steps`` steps (strace)."""
    log = cache.with_suffix(f".{steps}.strace")
    cmd = ["strace", "-f", "-qq", "-e", "trace=openat", "-o", str(log), sys.executable, __file__, "--count-opens",
           "--out", str(cache), "--steps", str(steps), "--batch", str(batch)]  # fmt: skip
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    return sum(str(cache) in line and ".safetensors" in line for line in log.read_text().splitlines())


def _opens(cache: Path, args: argparse.Namespace) -> tuple[int, float] | None:
    """``openat`` calls on ``cache``'s files while building the dataset (a 0-step read), and per training
    step: the opens of a ``--steps``-step read minus those, over ``--steps``."""
    if shutil.which("strace") is None:
        return None
    start = _cache_opens(cache, 0, args.batch)
    return start, (_cache_opens(cache, args.steps, args.batch) - start) / args.steps


def integrity_costs(gb: float) -> None:
    """Seconds per GB of hashing clips (:func:`mm_data.clip_digests`) and verifying shards (CRC-32)."""
    import hashlib

    import torch
    from mm_data import clip_digests, write_shard
    from mm_data.cache_plan import verify_files

    piece = min(64 << 20, int(gb * (1 << 30)) // 4 // 16 * 16)  # 64 MiB files (4 at least)
    count = max(4, int(gb * (1 << 30)) // piece)
    total_gb = count * piece / 1e9
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        clips = []
        for i in range(count):
            path = root / f"clip_{i:04d}.mp4"  # the bytes are what is hashed; nothing decodes them
            path.write_bytes(os.urandom(piece))
            clips.append(str(path))
        data = Path(clips[0]).read_bytes()
        start = time.perf_counter()
        hashlib.sha256(data).hexdigest()
        sha = piece / 1e9 / (time.perf_counter() - start)
        print(f"{count} files of {piece >> 20} MiB ({total_gb:.2f} GB) in the page cache; load average "
              f"{os.getloadavg()[0]:.2f}; hashlib.sha256 in memory: {sha:.2f} GB/s")  # fmt: skip
        print(f"\n{'check':<52} {'workers':>7} {'s':>7} {'s/GB':>6} {'GB/s':>6}")
        for workers in (1, 2):
            metadata = root / f"metadata_{workers}.json"
            for what in ("clip digests, no records yet", "clip digests, records to verify"):
                start = time.perf_counter()
                clip_digests(clips, metadata_path=metadata, workers=workers)
                took = time.perf_counter() - start
                print(f"{what:<52} {workers:>7} {took:>7.2f} {took / total_gb:>6.2f} {total_gb / took:>6.2f}")
        for path in clips:
            Path(path).unlink()
        shards = []
        for i in range(count):  # four float32 tensors of 16 MiB per shard
            tensors = {f"t{j}": torch.randn(piece // 16) for j in range(4)}
            shard = root / f"shard-{i:04d}.safetensors"
            write_shard(shard, [(f"{i:064x}", tensors, {})])
            shards.append((shard, shard.stat().st_size))
        size_gb = sum(size for _, size in shards) / 1e9
        for workers in (1, 2):
            start = time.perf_counter()
            damaged = verify_files(shards, workers)
            took = time.perf_counter() - start
            assert not damaged, damaged
            print(f"{'shard verification (every tensor CRC-32)':<52} {workers:>7} {took:>7.2f} "
                  f"{took / size_gb:>6.2f} {size_gb / took:>6.2f}")  # fmt: skip
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clips", type=int, default=16, help="synthetic clips (480x832 H.264)")
    parser.add_argument("--source-frames", type=int, default=33, help="frames per synthetic clip")
    parser.add_argument("--frames", type=int, default=17, help="frames read per clip (4k+1)")
    parser.add_argument("--height", type=int, default=128)
    parser.add_argument("--width", type=int, default=224)
    parser.add_argument("--vae-dim", type=int, default=16, help="base channels of the random Wan VAE")
    parser.add_argument("--steps", type=int, default=8, help="training steps read for the file-open count")
    parser.add_argument("--batch", type=int, default=4, help="samples per training step")
    parser.add_argument(
        "--integrity", action="store_true", help="measure the integrity checks' cost per GB only"
    )
    parser.add_argument(
        "--integrity-gb", type=float, default=1.0, help="GB of files the integrity checks read"
    )
    parser.add_argument("--rank-run", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--count-opens", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--report", help=argparse.SUPPRESS)
    parser.add_argument("--decode-workers", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_run:
        return rank_run(args)
    if args.count_opens:
        return count_opens(args)
    if args.integrity:
        return integrity_costs(args.integrity_gb)

    from mm_data import make_synthetic_dataset, write_per_file_copy

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        start = time.perf_counter()
        data = make_synthetic_dataset(root / "clips", num_clips=args.clips, sizes=[(480, 832)], fps=16,
                                      num_frames=args.source_frames, gop_size=16)  # fmt: skip
        print(f"wrote {args.clips} clips 480x832x{args.source_frames} in {time.perf_counter() - start:.1f}s; "
              f"reading {args.frames}x{args.height}x{args.width}; load average {os.getloadavg()[0]:.2f}")  # fmt: skip
        runs = [("1 rank, decode in the main process", 1, 0), ("2 ranks, decode in the main process", 2, 0),
                ("1 rank, decode in 1 DataLoader worker", 1, 1)]  # fmt: skip
        results = {}
        for name, nproc, workers in runs:
            results[name] = _torchrun(nproc, data, root / f"cache_{nproc}_{workers}", workers, args)
            results[name]["load"] = os.getloadavg()[0]
        base = results[runs[0][0]]["rate"]
        print(f"\n{'run':<40} {'clips':>5} {'encode s':>9} {'clips/s':>8} {'vs 1 rank':>9} {'load':>5}")
        for name, _, _ in runs:
            r = results[name]
            ratio = r["rate"] / base
            print(
                f"{name:<40} {r['computed']:>5} {r['encode_s']:>9.2f} {r['rate']:>8.3f} {ratio:>9.2f} {r['load']:>5.1f}"
            )
        sharded = root / "cache_1_0"
        per_file = write_per_file_copy(sharded, root / "per_file")
        shards = len(list(sharded.glob("shard-*.safetensors")))
        layouts = {f"sharded ({shards} shard(s))": sharded, f"per-file ({args.clips} files)": per_file}
        print(f"\nopenat calls on cache files (strace), {args.batch} samples per step, {args.steps} steps:")
        print(f"  {'layout':<24} {'building the dataset':>20} {'per step':>9}")
        for name, cache in layouts.items():
            value = _opens(cache, args)
            if value is None:
                print(f"  {name:<24} strace not found")
            else:
                print(f"  {name:<24} {value[0]:>20} {value[1]:>9.2f}")
        print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
