"""Checkpoint integrity through the trainer: a resume checks every file it reads against the CRC-32 its
save recorded (``training.verify_checksums``), and retention never deletes what an earlier rule kept
unless the command line says so (``--prune-kept-checkpoints``)."""

from __future__ import annotations

import io
import struct
import zipfile
from pathlib import Path

import pytest
from mm_checkpoint import read_checksums

pytestmark = pytest.mark.slow


def _flip_in(iteration_dir: Path, key: str, byte: int, mask: int) -> str:
    """Flip ``mask`` in byte ``byte`` of the tensor data of ``key``'s storage item (a ``torch.save`` zip
    whose ``data/0`` record holds the tensor's bytes); the file keeps its size. Returns the file's path."""
    digest = next(d for d in read_checksums(iteration_dir).values() if d.key.startswith(key + "@"))
    path = iteration_dir / digest.file
    data = bytearray(path.read_bytes())
    item = bytes(data[digest.offset : digest.offset + digest.length])
    with zipfile.ZipFile(io.BytesIO(item)) as archive:
        record = next(r for r in archive.infolist() if r.filename.endswith("/data/0"))
    name_len, extra_len = struct.unpack("<HH", item[record.header_offset + 26 : record.header_offset + 30])
    payload = record.header_offset + 30 + name_len + extra_len
    data[digest.offset + payload + byte] ^= mask
    path.write_bytes(bytes(data))
    return str(path)


def _error_of(build) -> str:
    try:
        trainer = build()
    except Exception as exc:  # noqa: BLE001 - the error is the result
        return f"{type(exc).__name__}: {exc}"
    return f"resumed at {trainer.start_iteration}"


def test_a_resume_of_a_checkpoint_with_flipped_tensor_bytes_stops_naming_them_unless_verify_checksums_is_false(
    distributed, toy_yaml, toy_trainer, mm_train_forked
):
    config = toy_yaml(training={"train_iters": 4, "save_interval": 2})
    mm_train_forked(config, nproc=2)
    iter4 = config.parent / "ckpt" / "iter_0000004"
    shard = _flip_in(iter4, "model.predictor.blocks.1.fc1.weight", 3, 0x40)  # the first float's exponent

    def resume(rank: int, world: int, *overrides: str) -> str:
        return _error_of(lambda: toy_trainer(config, world, "training.train_iters=6", *overrides))

    for message in distributed(resume, 2):
        assert message.startswith("CheckpointIntegrityError: checkpoint iteration 4 is corrupted: "), message
        assert shard in message and "'model.predictor.blocks.1.fc1.weight@" in message
        assert (
            f"Resume from the previous checkpoint, iteration 2 ({iter4.parent / 'iter_0000002'})" in message
        )
        assert "training.load=" in message
    assert (
        distributed(lambda r, w: resume(r, w, "training.verify_checksums=false"), 2) == ["resumed at 4"] * 2
    )


def test_dropping_keep_every_on_resume_keeps_its_milestones_unless_prune_kept_checkpoints_is_given(
    toy_yaml, mm_train_forked
):
    config = toy_yaml(training={"train_iters": 5, "save_interval": 1, "keep_last": 1, "keep_every": 2})
    ckpt = config.parent / "ckpt"

    def iterations() -> list[str]:
        return sorted(p.name for p in ckpt.glob("iter_*"))

    mm_train_forked(config)
    assert iterations() == ["iter_0000002", "iter_0000004", "iter_0000005"]
    mm_train_forked(config, "training.train_iters=6", "training.keep_every=null")
    assert iterations() == ["iter_0000002", "iter_0000004", "iter_0000006"]  # the milestones stay
    mm_train_forked(config, "training.train_iters=7", "training.keep_every=null", "--prune-kept-checkpoints")
    assert iterations() == ["iter_0000007"]
