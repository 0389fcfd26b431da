import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from mm_data import (
    PrecomputedLatentDataset,
    VideoTextDataset,
    cache_dataset,
    cache_file_name,
    load_precomputed,
)

ENCODER = """
import hashlib, os, time
import torch

def encode(item):
    time.sleep(float(os.environ.get("ENC_SLEEP", "0")))
    latents = torch.nn.functional.avg_pool3d(item["video"][None], (1, 4, 4))[0]
    g = torch.Generator().manual_seed(int(hashlib.sha256(item["prompt"].encode()).hexdigest()[:8], 16))
    return {
        "latents": latents,
        "prompt_embeds": torch.randn(8, 16, generator=g),
        "prompt_attention_mask": torch.ones(8, dtype=torch.long),
        "metadata": {"encoder": "test"},
    }
"""
DATASET_KWARGS = {
    "num_frames": 9,
    "height": 16,
    "width": 16,
    "frame_offset": "start",
    "max_bad_fraction": 0.3,
}


@pytest.fixture
def encoder(tmp_path: Path):
    path = tmp_path / "toy_encoder.py"
    path.write_text(textwrap.dedent(ENCODER))
    spec = importlib.util.spec_from_file_location("toy_encoder", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def start_cli_cache(clips: Path, out: Path, encoder_dir: Path) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "mm_data",
        "cache",
        str(clips),
        "--out",
        str(out),
        "--encoder",
        "toy_encoder:encode",
    ]
    cmd += [
        "--num-frames",
        "9",
        "--height",
        "16",
        "--width",
        "16",
        "--dataset-kwargs",
        '{"max_bad_fraction": 0.3}',
    ]
    env = {**os.environ, "PYTHONPATH": str(encoder_dir), "ENC_SLEEP": "0.4", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def cached(out: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in out.glob("*.safetensors")}


@pytest.mark.slow
def test_killed_cache_run_resumes_without_redoing_files(clips: Path, kinds_of, tmp_path: Path, encoder):
    out = tmp_path / "cache"
    proc = start_cli_cache(clips, out, tmp_path)
    deadline = time.monotonic() + 60
    while (
        len(cached(out) if out.exists() else {}) < 2 and time.monotonic() < deadline and proc.poll() is None
    ):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = cached(out)
    good = [i for i, k in enumerate(kinds_of(clips)) if k == "clip"]
    assert 2 <= len(before) < len(good), "the kill must land mid-run"

    dataset = VideoTextDataset(clips, **DATASET_KWARGS)
    report = cache_dataset(dataset, encoder.encode, out, progress=False)

    assert sorted(cache_file_name(i) for i in report.skipped) == sorted(before)
    assert sorted(report.skipped + report.written) == good
    assert sorted(b.index for b in report.bad) == [i for i, k in enumerate(kinds_of(clips)) if k != "clip"]
    after = cached(out)
    assert {name: after[name] for name in before} == before
    assert not list(out.glob(".*.tmp"))

    precomputed = PrecomputedLatentDataset(out)
    assert len(precomputed) == len(good)
    for item in precomputed:
        index = item["metadata"]["index"]
        expected = encoder.encode(dataset[index])
        for key in ("latents", "prompt_embeds", "prompt_attention_mask"):
            assert torch.equal(item[key], expected[key]), (index, key)
        assert item["prompt"] == dataset[index]["prompt"] and item["metadata"]["encoder"] == "test"
        assert item["metadata"]["path"] == dataset.rows[index]["path"]


def test_ranks_cache_disjoint_shards(clips: Path, tmp_path: Path, encoder):
    dataset = VideoTextDataset(clips, **DATASET_KWARGS)
    reports = [
        cache_dataset(dataset, encoder.encode, tmp_path, rank=r, world_size=2, progress=False) for r in (0, 1)
    ]
    assert all(i % 2 == r for r, rep in enumerate(reports) for i in rep.written)
    assert len(PrecomputedLatentDataset(tmp_path)) == sum(len(r.written) for r in reports)


def test_precomputed_metadata_is_json_in_the_header(tmp_path: Path):
    from mm_data import save_precomputed

    save_precomputed(tmp_path / "a.safetensors", {"latents": torch.ones(2)}, {"prompt": "x", "fps": 16})
    tensors, metadata = load_precomputed(tmp_path / "a.safetensors")
    assert metadata == {"prompt": "x", "fps": 16} and torch.equal(tensors["latents"], torch.ones(2))
    with pytest.raises(KeyError, match="missing tensors"):
        PrecomputedLatentDataset(tmp_path)[0]


def test_precomputed_samples_batch_through_the_loader(clips: Path, tmp_path: Path, encoder):
    from mm_data import build_dataloader

    cache_dataset(VideoTextDataset(clips, **DATASET_KWARGS), encoder.encode, tmp_path, progress=False)
    precomputed = PrecomputedLatentDataset(tmp_path)
    loader = build_dataloader(precomputed, global_batch_size=2, dp_rank=0, dp_size=1, seed=0)
    batch = next(iter(loader))
    assert batch["latents"].shape == (2, 3, 9, 4, 4) and batch["prompt_embeds"].shape == (2, 8, 16)
    assert len(batch["prompt"]) == 2 and batch["metadata"][0]["encoder"] == "test"
