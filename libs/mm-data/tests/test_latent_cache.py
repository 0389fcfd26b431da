"""The sharded, content-keyed latent cache: incremental re-runs, resumed interruptions, corrupt shards,
ranks, the clip facts probed once, clips changed in place, how the cache was made and the check of a
run against it, one preprocess run per cache (docs/DESIGN.md "Latent cache")."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import struct
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from mm_data import (
    CACHE_MANIFEST,
    INDEX_NAME,
    CachedVideoTextDataset,
    CacheIndex,
    CacheLockedError,
    CacheMismatchError,
    CorruptShardError,
    PrecomputedLatentDataset,
    VideoTextDataset,
    build_dataloader,
    cache_dataset,
    check_cache_made_with,
    clip_info_path,
    make_synthetic_dataset,
    open_cache,
    sha256_file,
    shard_layout,
    write_clip,
    write_per_file_copy,
)
from mm_data.cache_encode import KILL_HOOK_ENV
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

READ = {"num_frames": 9, "height": 16, "width": 16, "frame_offset": "start", "max_bad_fraction": 0.3}
IDENTITY = {"encoder": "toy", "version": 1}
RECIPE = {"preprocess.clips.height": 16, "preprocess.clips.width": 16, "preprocess.encoder": "toy"}
"""What a maker says the cache is made from, in its own keys (the apps: their preprocess section)."""


DISTINCT = list(
    itertools.product(["red", "green", "blue", "yellow", "white"], ["square", "circle"], ["left", "right"])
)


def tiny_clips(root: Path, num_clips: int = 20, corrupt: int = 0) -> Path:
    """``num_clips`` (at most 20) distinct 16x16 9-frame mp4s (+ ``corrupt`` unreadable ones): the metadata
    file. (Two rows with the same clip and captions are one sample of the cache.)"""
    return make_synthetic_dataset(
        root, num_clips=num_clips, sizes=[(16, 16)], fps=8, num_frames=9, corrupt=corrupt, shapes=DISTINCT
    )


def write_cache(metadata: Path, out: Path, toy, **kwargs):
    dataset = VideoTextDataset(metadata, **READ)
    kwargs = {"identity": IDENTITY, "uses_prompt": False, "shard_size": 4, "num_workers": 0, **kwargs}
    return cache_dataset(dataset, toy.encoder(dataset), out, progress=False, **kwargs)


def folder_bytes(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def rows_of(metadata: Path) -> list[dict]:
    return json.loads(metadata.read_text())


def assert_each_row_holds_its_own_clip_and_captions(metadata: Path, out: Path, toy) -> None:
    """Every cached row equals a direct encode of that row's clip and captions."""
    clips = VideoTextDataset(metadata, **READ)
    cached = CachedVideoTextDataset(out, max_bad_fraction=0.3)
    for row in range(len(clips)):
        direct = toy.encoder(clips)(clips.sample(row))
        tensors, meta = cached.store.read(row)
        assert torch.equal(tensors["latents"], direct["latents"]), row
        assert meta["caption"] == clips.rows[row]["caption"], row
        assert all(torch.equal(tensors[k], direct[k]) for k in direct if k.startswith("prompt_embeds.")), row


def test_changing_one_clip_of_twenty_encodes_exactly_that_one_and_reuses_nineteen(tmp_path, toy):
    metadata = tiny_clips(tmp_path / "clips")
    first = write_cache(metadata, tmp_path / "cache", toy)
    assert len(first.computed) == 20 and first.reused == [] and first.shards_written > 1
    before = folder_bytes(tmp_path / "cache")
    noise = np.random.default_rng(0).integers(0, 255, (9, 16, 16, 3), dtype=np.uint8)
    write_clip(tmp_path / "clips" / "clip_0007.mp4", noise, fps=8)

    report = write_cache(metadata, tmp_path / "cache", toy)

    assert report.computed == [7] and report.reused == [r for r in range(20) if r != 7]
    assert (report.dropped, report.failed, report.shards_written) == (1, [], 1)  # the old clip 7's shard
    after = folder_bytes(tmp_path / "cache")
    assert len(set(after) - set(before)) == 1 and len(set(before) - set(after)) == 1  # one shard replaced
    assert_each_row_holds_its_own_clip_and_captions(metadata, tmp_path / "cache", toy)


def test_removing_a_row_drops_it_and_every_other_sample_keeps_its_own_latents_and_captions(tmp_path, toy):
    metadata = tiny_clips(tmp_path / "clips")
    write_cache(metadata, tmp_path / "cache", toy)
    rows = rows_of(metadata)
    metadata.write_text(json.dumps(rows[:5] + rows[6:]))

    report = write_cache(metadata, tmp_path / "cache", toy)

    assert report.samples == 19 and report.computed == [] and report.reused == list(range(19))
    assert report.dropped == 1 and report.shards_written <= 2  # its shard (and at most the next) repacked
    assert_each_row_holds_its_own_clip_and_captions(metadata, tmp_path / "cache", toy)
    cached = CachedVideoTextDataset(tmp_path / "cache")
    assert [cached[i]["index"] for i in range(19)] == list(range(19))


def killed(fork, run, at: str) -> None:
    """``run()`` in a child (forked by the root conftest's ``fork``) that SIGKILLs itself at the hook
    point ``at`` (``encoded:N`` / ``packed:N``)."""
    pid = fork()
    if pid == 0:  # pragma: no cover - the child
        torch.set_num_threads(1)  # the parent's OpenMP pool does not survive a fork
        os.environ[KILL_HOOK_ENV] = at
        try:
            run()
        finally:
            os._exit(0)  # the hook did not fire: the parent's assertion fails
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, f"not killed at {at}"


def test_a_run_killed_while_encoding_or_packing_resumes_to_the_bytes_of_an_uninterrupted_run(
    tmp_path, toy, fork
):
    """Fresh run killed after 7 encoded samples; an update (one clip changed, one row removed) killed after
    its first shard is written, before the index: each re-run ends with an uninterrupted run's bytes."""
    metadata = tiny_clips(tmp_path / "clips", corrupt=1)
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    write_cache(metadata, straight, toy)
    killed(fork, lambda: write_cache(metadata, resumed, toy), "encoded:7")
    assert len(list((resumed / "staging").glob("*.safetensors"))) == 7 and not (resumed / INDEX_NAME).exists()
    report = write_cache(metadata, resumed, toy)
    assert len(report.resumed) == 7 and len(report.computed) == 13 and len(report.failed) == 1
    assert folder_bytes(resumed) == folder_bytes(straight)

    rows = rows_of(metadata)
    metadata.write_text(json.dumps(rows[:2] + rows[3:]))
    write_clip(tmp_path / "clips" / "clip_0010.mp4", np.full((9, 16, 16, 3), 200, np.uint8), fps=8)
    write_cache(metadata, straight, toy)
    killed(fork, lambda: write_cache(metadata, resumed, toy), "packed:1")
    assert CacheIndex.load(resumed).num_samples == 21  # the old index still rules the folder
    write_cache(metadata, resumed, toy)
    assert folder_bytes(resumed) == folder_bytes(straight)


def test_a_corrupt_shard_is_reported_with_its_path_and_samples_and_a_rerun_recomputes_them(tmp_path, toy):
    metadata = tiny_clips(tmp_path / "clips", num_clips=8)
    write_cache(metadata, tmp_path / "cache", toy)
    index = CacheIndex.load(tmp_path / "cache")
    shard = index.shards[1]
    path = tmp_path / "cache" / shard.name
    rows = index.shard_rows(shard.name)
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF  # one flipped bit pattern in the last tensor's bytes
    path.write_bytes(bytes(data))

    cached = CachedVideoTextDataset(tmp_path / "cache")
    with pytest.raises(CorruptShardError, match="fails its CRC-32") as error:
        [cached[row] for row in rows]
    assert error.value.path == str(path) and error.value.samples == rows and str(path) in str(error.value)
    assert f"it held samples {rows}" in str(error.value)

    path.write_bytes(bytes(data[:100]))  # truncated: the rerun finds it before reading it
    report = write_cache(metadata, tmp_path / "cache", toy)
    assert len(report.corrupt) == 1 and str(path) in report.corrupt[0] and str(rows) in report.corrupt[0]
    assert report.computed == rows
    assert_each_row_holds_its_own_clip_and_captions(metadata, tmp_path / "cache", toy)


def test_the_encoders_identity_and_the_reading_parameters_are_in_the_keys(tmp_path, toy):
    metadata = tiny_clips(tmp_path / "clips", num_clips=4)
    write_cache(metadata, tmp_path / "cache", toy)
    assert write_cache(metadata, tmp_path / "cache", toy).computed == []
    assert write_cache(metadata, tmp_path / "cache", toy, identity={**IDENTITY, "version": 2}).computed == [
        0,
        1,
        2,
        3,
    ]
    dataset = VideoTextDataset(metadata, **{**READ, "frame_offset": "center"})
    report = cache_dataset(dataset, toy.encoder(dataset), tmp_path / "cache", identity={**IDENTITY, "version": 2},
                           uses_prompt=False, num_workers=0, progress=False)  # fmt: skip
    assert report.computed == [0, 1, 2, 3] and report.dropped == 4


def test_rows_are_keyed_by_position_only_when_the_encoder_reads_a_drawn_prompt(tmp_path, toy):
    metadata = tiny_clips(tmp_path / "clips", num_clips=4)  # synthetic captions are lists of two
    write_cache(metadata, tmp_path / "cache", toy, uses_prompt=True)
    metadata.write_text(json.dumps(rows_of(metadata)[1:]))
    assert write_cache(metadata, tmp_path / "cache", toy, uses_prompt=True).computed == [
        0,
        1,
        2,
    ]  # drawn anew
    write_cache(metadata, tmp_path / "other", toy)
    metadata.write_text(json.dumps(rows_of(metadata)[1:]))
    assert write_cache(metadata, tmp_path / "other", toy).computed == []


def test_a_random_frame_offset_is_refused(tmp_path, toy):
    dataset = VideoTextDataset(tiny_clips(tmp_path, num_clips=1), **{**READ, "frame_offset": "random"})
    with pytest.raises(ValueError, match="one window per clip"):
        cache_dataset(dataset, toy.encoder(dataset), tmp_path / "cache", identity=IDENTITY, progress=False)


def test_the_shard_layout_is_cut_by_content_so_a_change_stays_local():
    keys = [f"{i:064x}"[::-1] for i in range(1, 400)]  # distinct, pseudo-random leading digits
    keys = [__import__("hashlib").sha256(k.encode()).hexdigest() for k in keys]
    layout = shard_layout(keys, 16)
    assert [k for shard in layout for k in shard] == keys
    assert 8 <= min(len(s) for s in layout[:-1]) and max(len(s) for s in layout) <= 64
    assert 12 <= len(keys) / len(layout) <= 20
    changed = shard_layout(keys[:100] + ["f" * 64] + keys[101:], 16)
    assert len({tuple(s) for s in changed} - {tuple(s) for s in layout}) <= 2
    removed = shard_layout(keys[:100] + keys[101:], 16)
    assert len({tuple(s) for s in removed} - {tuple(s) for s in layout}) <= 2


def test_a_training_epoch_opens_each_shard_once_not_each_sample(tmp_path, toy):
    metadata = tiny_clips(tmp_path / "clips", num_clips=16)
    write_cache(metadata, tmp_path / "cache", toy, shard_size=8)
    cached = PrecomputedLatentDataset(tmp_path / "cache", required=["latents"])
    loader = build_dataloader(cached, global_batch_size=4, dp_rank=0, dp_size=1, seed=0)
    batches = list(loader)
    assert len(batches) == 4 and cached.store is not None
    assert cached.store.reader.opened == len(CacheIndex.load(tmp_path / "cache").shards) < 16


def test_clip_facts_are_probed_once_beside_the_metadata_and_again_when_a_clip_changes(tmp_path, monkeypatch):
    metadata = tiny_clips(tmp_path, num_clips=3)
    metadata.write_text(
        json.dumps([{"path": r["path"], "cap": r["cap"]} for r in rows_of(metadata)])
    )  # no sizes
    buckets = [[16, 16, 9], [16, 32, 9]]
    first = VideoTextDataset(metadata, **READ, buckets=buckets)
    stored = json.loads(clip_info_path(metadata).read_text())["records"]
    assert len(stored) == 3 and all(r["probe"] == [9, 8.0, 16, 16] for r in stored.values())

    probed = []
    monkeypatch.setattr(sys.modules["mm_data.clip_info"], "probe_video", probed.append)
    again = VideoTextDataset(metadata, **READ, buckets=buckets)
    assert again.bucket_ids == first.bucket_ids and probed == []  # read back, not probed
    monkeypatch.undo()
    write_clip(tmp_path / "clip_0001.mp4", np.zeros((13, 16, 32, 3), np.uint8), fps=8)
    changed = VideoTextDataset(metadata, **READ, buckets=buckets)
    assert changed.bucket_ids[1] != first.bucket_ids[1]
    assert json.loads(clip_info_path(metadata).read_text())["records"][str(tmp_path / "clip_0001.mp4")][
        "probe"
    ] == [13, 8.0, 16, 32]


def rewrite_in_place(path: Path, frames: np.ndarray) -> None:
    """Rewrite the clip ``path`` with ``frames`` under its old size and mtime, as ``rsync -t``, ``tar`` and
    ``cp -p`` leave a replaced file: the new clip (encoded smaller) is padded with an mp4 ``free`` box."""
    before = path.stat()
    fresh = path.with_name(f".new{path.suffix}")
    write_clip(fresh, frames, fps=8)
    data = fresh.read_bytes()
    fresh.unlink()
    pad = before.st_size - len(data)
    assert pad >= 8, "the new clip must encode smaller than the old one"
    with open(path, "r+b") as f:
        f.write(data + struct.pack(">I", pad) + b"free" + bytes(pad - 8))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)


def test_a_clip_rewritten_in_place_with_its_size_and_mtime_kept_is_hashed_and_encoded_again(tmp_path, toy):
    """The clip's bytes decide, not its stat; its bucket follows its new header too (its probed facts went
    with its digest)."""
    metadata = tiny_clips(tmp_path / "clips", num_clips=4)
    metadata.write_text(json.dumps([{"path": r["path"], "cap": r["cap"]} for r in rows_of(metadata)]))
    clip = tmp_path / "clips" / "clip_0001.mp4"
    write_clip(clip, np.random.default_rng(0).integers(0, 255, (9, 16, 16, 3), dtype=np.uint8), fps=8)
    read = {**READ, "buckets": [[16, 16, 9], [16, 32, 9]]}

    def run() -> tuple[VideoTextDataset, object]:
        dataset = VideoTextDataset(metadata, **read)
        report = cache_dataset(dataset, toy.encoder(dataset), tmp_path / "cache", identity=IDENTITY,
                               uses_prompt=False, shard_size=4, num_workers=0, progress=False)  # fmt: skip
        return dataset, report

    first, _ = run()
    rewrite_in_place(clip, np.full((9, 16, 32, 3), 200, np.uint8))
    dataset, report = run()

    assert report.rewritten == [str(clip)] and report.computed == [1] and report.reused == [0, 2, 3]
    assert first.bucket_ids[1] == 0 and dataset.bucket_ids[1] == 1  # 16x16 then, 16x32 now
    assert CacheIndex.load(tmp_path / "cache").bucket_ids == dataset.bucket_ids
    tensors, _ = open_cache(tmp_path / "cache").read(1)
    assert torch.equal(tensors["latents"], toy.pooled(dataset.sample(1)["video"]))
    assert tensors["latents"].shape[-2:] == (4, 8)


def test_a_rerun_verifies_every_shard_and_encodes_again_the_samples_of_one_failing_its_crc(tmp_path, toy):
    """A flipped byte keeps the file's size: only the CRC tells. The rerun names the shard and its rows,
    encodes them again, and the shard is the one an undamaged run wrote."""
    metadata = tiny_clips(tmp_path / "clips", num_clips=8)
    write_cache(metadata, tmp_path / "cache", toy)
    index = CacheIndex.load(tmp_path / "cache")
    path = tmp_path / "cache" / index.shards[1].name
    rows = index.shard_rows(index.shards[1].name)
    before = path.read_bytes()
    damaged = bytearray(before)
    damaged[-5] ^= 0xFF
    path.write_bytes(bytes(damaged))

    report = write_cache(metadata, tmp_path / "cache", toy)

    assert len(report.corrupt) == 1 and report.corrupt[0].startswith(f"{path}: tensor ")
    assert f"fails its CRC-32; its rows {rows} are encoded again" in report.corrupt[0]
    assert report.computed == rows and report.shards_written == 1 and path.read_bytes() == before
    assert_each_row_holds_its_own_clip_and_captions(metadata, tmp_path / "cache", toy)


def test_a_damaged_sample_an_interrupted_run_staged_is_named_and_encoded_again_on_resume(tmp_path, toy, fork):
    """Before, packing read it and failed on its CRC on every resume until it was deleted by hand."""
    metadata = tiny_clips(tmp_path / "clips", num_clips=8)
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    write_cache(metadata, straight, toy)
    killed(fork, lambda: write_cache(metadata, resumed, toy), "encoded:3")
    staged = sorted((resumed / "staging").glob("*.safetensors"))[1]
    damaged = bytearray(staged.read_bytes())
    damaged[-3] ^= 0xFF
    staged.write_bytes(bytes(damaged))

    report = write_cache(metadata, resumed, toy)

    [line] = report.corrupt
    assert line.startswith(f"{staged}: tensor {staged.stem}/")
    assert line.endswith("fails its CRC-32; its samples are encoded again")
    assert len(report.resumed) == 2 and len(report.computed) == 6
    assert folder_bytes(resumed) == folder_bytes(straight)


def test_a_second_preprocess_run_of_one_cache_is_refused_naming_the_run_that_holds_it(tmp_path, toy, fork):
    """The first run (a forked child) holds the cache while it encodes; the second is refused at once and
    leaves the first one's work alone, which then finishes."""
    metadata = tiny_clips(tmp_path / "clips", num_clips=4)
    started, go = tmp_path / "started", tmp_path / "go"
    pid = fork()
    if pid == 0:  # pragma: no cover - the child: the first run
        code = 1
        try:
            torch.set_num_threads(1)
            dataset = VideoTextDataset(metadata, **READ)
            encode = toy.encoder(dataset)

            def held(item: dict) -> dict:
                started.touch()
                deadline = time.monotonic() + 60
                while not go.exists() and time.monotonic() < deadline:
                    time.sleep(0.05)
                return encode(item)

            cache_dataset(dataset, held, tmp_path / "cache", identity=IDENTITY, uses_prompt=False,
                          num_workers=0, progress=False)  # fmt: skip
            code = 0
        finally:
            os._exit(code)
    try:
        deadline = time.monotonic() + 60
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started.exists(), "the first run did not start encoding"
        with pytest.raises(
            CacheLockedError, match=rf"is being written by another preprocess run \(pid {pid} on host "
        ):
            write_cache(metadata, tmp_path / "cache", toy)
    finally:
        go.touch()
        _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, "the first run failed"
    assert write_cache(metadata, tmp_path / "cache", toy).computed == []  # its cache is whole


def test_the_index_records_how_the_cache_was_made_and_a_check_with_the_same_recipe_passes(tmp_path, toy):
    metadata = tiny_clips(tmp_path / "clips", num_clips=4)
    write_cache(metadata, tmp_path / "cache", toy, recipe=RECIPE)
    record = CacheIndex.load(tmp_path / "cache").made_with
    assert record["recipe"] == RECIPE and record["encoders"] == IDENTITY
    assert record["reading"]["buckets"] == [[16, 16, 9]] and record["reading"]["frame_offset"] == "start"
    assert record["source"] == {"path": str(metadata.resolve()), "sha256": sha256_file(metadata), "rows": 4}
    check_cache_made_with(tmp_path / "cache", dict(RECIPE))


def test_a_cache_made_with_other_values_is_refused_naming_each_key_and_both_values(tmp_path, toy):
    metadata = tiny_clips(tmp_path / "clips", num_clips=4)
    write_cache(metadata, tmp_path / "cache", toy, recipe=RECIPE)
    run = {**RECIPE, "preprocess.clips.height": 32, "preprocess.tiling": True}
    with pytest.raises(CacheMismatchError) as error:
        check_cache_made_with(tmp_path / "cache", run)
    message = str(error.value)
    assert "preprocess.clips.height: the cache was made with 16, this run says 32" in message
    assert "preprocess.tiling: the cache was made with (not set), this run says true" in message
    assert "preprocess.clips.width" not in message and "run the preprocess with this config again" in message


def test_a_cache_whose_source_metadata_changed_since_it_was_made_is_refused_until_a_rerun(tmp_path, toy):
    metadata = tiny_clips(tmp_path / "clips", num_clips=4)
    write_cache(metadata, tmp_path / "cache", toy, recipe=RECIPE)
    metadata.write_text(json.dumps(rows_of(metadata)[1:]))
    changed = rf"the source metadata {re.escape(str(metadata.resolve()))} changed since the cache was made"
    with pytest.raises(CacheMismatchError, match=rf"{changed} \(SHA-256 .*; 4 rows then\)"):
        check_cache_made_with(tmp_path / "cache", RECIPE)
    assert write_cache(metadata, tmp_path / "cache", toy, recipe=RECIPE).computed == []
    check_cache_made_with(tmp_path / "cache", RECIPE)


def test_a_cache_of_a_caption_folder_records_its_rows_and_is_refused_once_a_caption_changes(tmp_path, toy):
    """A caption folder as the source: the record's digest is that of the folder's rows (clip paths and
    captions), so an edited caption refuses the run until a rerun encodes that sample again."""
    metadata = tiny_clips(tmp_path / "clips", num_clips=3)
    folder = tmp_path / "captioned"
    folder.mkdir()
    for row in rows_of(metadata):
        clip = folder / Path(row["path"]).name
        clip.write_bytes((metadata.parent / row["path"]).read_bytes())
        clip.with_suffix(".txt").write_text(row["cap"][0])
    write_cache(folder, tmp_path / "cache", toy, recipe=RECIPE)
    check_cache_made_with(tmp_path / "cache", RECIPE)
    first = sorted(folder.glob("*.txt"))[0]
    first.write_text("a different caption")
    with pytest.raises(
        CacheMismatchError, match=rf"the source metadata {re.escape(str(folder.resolve()))} changed"
    ):
        check_cache_made_with(tmp_path / "cache", RECIPE)
    write_cache(folder, tmp_path / "cache", toy, recipe=RECIPE)
    check_cache_made_with(tmp_path / "cache", RECIPE)


def test_a_cache_that_records_no_recipe_is_still_read_refused_by_the_check_and_recorded_by_a_rerun(
    tmp_path, toy
):
    """An index of version 1 (before the record) and a per-file cache of earlier versions: read by the
    datasets, refused by the check; a rerun rewrites the index without encoding, and a per-file copy of
    a recorded cache carries the record."""
    metadata = tiny_clips(tmp_path / "clips", num_clips=4)
    cache = tmp_path / "cache"
    write_cache(metadata, cache, toy, recipe=RECIPE)
    data = json.loads((cache / INDEX_NAME).read_text())
    (cache / INDEX_NAME).write_text(
        json.dumps({**{k: v for k, v in data.items() if k != "made_with"}, "version": 1})
    )
    per_file = write_per_file_copy(cache, tmp_path / "per_file")
    assert len(CachedVideoTextDataset(cache)) == len(CachedVideoTextDataset(per_file)) == 4
    for old in (cache, per_file):
        with pytest.raises(CacheMismatchError, match="records no recipe .* remove the preprocess section"):
            check_cache_made_with(old, RECIPE)

    report = write_cache(metadata, cache, toy, recipe=RECIPE)
    assert report.computed == [] and report.shards_written == 0
    check_cache_made_with(cache, RECIPE)
    copy = write_per_file_copy(cache, tmp_path / "per_file_again")
    assert json.loads((copy / CACHE_MANIFEST).read_text())["made_with"]["recipe"] == RECIPE
    check_cache_made_with(copy, RECIPE)


def _text_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))


def _write_with_text_model(metadata: Path, out: Path, toy, text_model: torch.nn.Module, **kwargs) -> dict:
    """The toy cache with every caption embedding passed through ``text_model`` (sharded or not)."""
    dataset = VideoTextDataset(metadata, **READ)
    base = toy.encoder(dataset)

    @torch.no_grad()
    def encode(item: dict) -> dict:
        out = base(item)
        return {k: text_model(v) if k.startswith("prompt_embeds.") else v for k, v in out.items()}

    @torch.no_grad()
    def idle() -> None:
        text_model(torch.zeros(1, 4))

    report = cache_dataset(dataset, encode, out, identity=IDENTITY, uses_prompt=False, shard_size=4,
                           progress=False, idle=idle, **kwargs)  # fmt: skip
    return {"computed": report.computed, "failed": [b.index for b in report.failed]}


def _two_ranks(rank: int, world_size: int, metadata: Path, out: Path, toy) -> dict:
    model = _text_model()
    mesh = init_device_mesh("cpu", (world_size,))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return _write_with_text_model(metadata, out, toy, model, num_workers=1, rank=rank, world_size=world_size)


@pytest.mark.slow
def test_two_ranks_with_a_text_encoder_sharded_over_them_write_the_bytes_of_one_rank(
    tmp_path, toy, distributed
):
    """21 rows (one corrupt): the ranks encode 11 / 10 rows, a decode failure on one of them, and call the
    FSDP-sharded model in lockstep; the cache equals one process's with the unsharded model."""
    metadata = tiny_clips(tmp_path / "clips", corrupt=1)
    one = _write_with_text_model(metadata, tmp_path / "one", toy, _text_model(), num_workers=0)
    reports = distributed(_two_ranks, 2, metadata, tmp_path / "two", toy)
    assert reports[0] == reports[1] == one and len(one["computed"]) == 20 and one["failed"] == [20]
    assert folder_bytes(tmp_path / "two") == folder_bytes(tmp_path / "one")
