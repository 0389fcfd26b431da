"""Decode + transform throughput of `mm_data.VideoTextDataset` (clips/s) on 0, 1 and 2 DataLoader workers,
with and without the per-sample deadline (``decode_timeout_s``: each sample read in a helper thread).

Writes synthetic 480x832 H.264 clips (81 frames, 16 fps, keyframe every 16 frames) and times
loading 49-frame samples at 480x832 (PyAV seek + decode of the needed range, resize/crop,
normalize to [-1, 1]). Usage:

    python benchmarks/data_throughput.py [--clips 4] [--samples 24] [--workers 0 1 2] [--deadlines none 120]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from mm_data import VideoTextDataset, call_with_deadline, collate_video_text, make_synthetic_dataset
from torch.utils.data import DataLoader


def measure(dataset: VideoTextDataset, samples: int, workers: int) -> float:
    """Clips per second over ``samples`` items (the first item, which pays worker start-up, is excluded)."""
    order = [i % len(dataset) for i in range(samples + 1)]
    loader = DataLoader(
        dataset, batch_size=1, sampler=order, num_workers=workers, collate_fn=collate_video_text
    )
    it = iter(loader)
    next(it)
    start = time.perf_counter()
    count = sum(1 for _ in it)
    return count / (time.perf_counter() - start)


def deadline_overhead_us(calls: int = 2000) -> float:
    """Microseconds ``call_with_deadline`` adds to one call (a helper thread started and joined)."""
    start = time.perf_counter()
    for _ in range(calls):
        call_with_deadline(lambda: None, 120.0, "noop")
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clips", type=int, default=4)
    parser.add_argument("--samples", type=int, default=24)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--width", type=int, default=832)
    parser.add_argument("--num-frames", type=int, default=49)
    parser.add_argument(
        "--deadlines",
        nargs="+",
        default=["none", "120"],
        help="decode_timeout_s values to compare ('none': off)",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        meta = make_synthetic_dataset(
            Path(tmp),
            num_clips=args.clips,
            sizes=[(args.height, args.width)],
            fps=16,
            num_frames=81,
            gop_size=16,
        )
        print(f"wrote {args.clips} clips {args.height}x{args.width}x81 in {time.perf_counter() - t0:.1f}s")
        print(f"the deadline's helper thread adds {deadline_overhead_us():.0f} us per sample")
        print(f"\n{'deadline':>8} | {'workers':>7} | {'clips/s':>8} | {'ms/clip':>8} | {'frames/s':>8}")
        print("-" * 53)
        for deadline in args.deadlines:
            timeout = None if deadline.lower() == "none" else float(deadline)
            dataset = VideoTextDataset(
                meta, num_frames=args.num_frames, height=args.height, width=args.width, fps=16,
                decode_timeout_s=timeout,
            )  # fmt: skip
            for workers in args.workers:
                rate = measure(dataset, args.samples, workers)
                print(
                    f"{deadline:>8} | {workers:>7} | {rate:8.2f} | {1000 / rate:8.1f} | {rate * args.num_frames:8.0f}"
                )


if __name__ == "__main__":
    main()
