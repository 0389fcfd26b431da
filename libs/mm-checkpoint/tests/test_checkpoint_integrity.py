"""Checkpoint integrity: every save records a CRC-32 of each DCP storage item (``mm_checksums.json``),
every reader (resume, export, ``mm-ckpt``) checks the items it reads, and a corrupted file is named with
its tensor, its iteration and the checkpoint to resume instead."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from mm_checkpoint import (
    CHECKSUMS_FILENAME,
    CheckpointError,
    CheckpointIntegrityError,
    DistributedCheckpointer,
    export_checkpoint,
    latest_iteration,
    read_checksums,
)
from mm_checkpoint.cli import main as mm_ckpt
from torch import nn


@pytest.fixture(autouse=True)
def _single_process_save_notice():
    with warnings.catch_warnings():  # DCP's notice from a background writer thread without a process group
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 4))


def _state(seed: int = 0) -> dict:
    model = _model(seed)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 32)).sum().backward()
    optimizer.step()
    return {"model": model, "optimizer": optimizer, "position": {"epoch": 3}}


def _empty_state() -> dict:
    model = _model(7)
    return {"model": model, "optimizer": torch.optim.AdamW(model.parameters()), "position": {}}


def _flip(directory: Path, key: str, tensor: torch.Tensor, byte: int, mask: int) -> None:
    """Flip ``mask`` in byte ``byte`` of the first float32 of ``tensor``'s bytes inside its storage item
    (the file keeps its size)."""
    digest = next(d for d in read_checksums(directory).values() if d.key.startswith(key + "@"))
    path = directory / digest.file
    data = bytearray(path.read_bytes())
    item = bytes(data[digest.offset : digest.offset + digest.length])
    at = digest.offset + item.index(tensor.detach().contiguous().numpy().tobytes())
    data[at + byte] ^= mask
    path.write_bytes(bytes(data))


MANTISSA, EXPONENT = (0, 0x01), (3, 0x40)  # little-endian float32: low mantissa byte; an exponent bit


@pytest.mark.parametrize("background", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("flip", [MANTISSA, EXPONENT], ids=["mantissa", "exponent"])
def test_a_flipped_byte_inside_a_saved_tensor_is_named_with_file_tensor_iteration_and_the_checkpoint_to_resume(
    tmp_path: Path, background: bool, flip: tuple[int, int]
) -> None:
    state = _state()
    ckpt = DistributedCheckpointer(tmp_path)
    ckpt.save(state, 1)
    ckpt.save(state, 2, background=background)
    ckpt.finish_pending()
    iter2 = tmp_path / "iter_0000002"
    assert json.loads((iter2 / "mm_checkpoint.json").read_text())["checksums"] == "crc32"
    _flip(iter2, "model.0.weight", state["model"][0].weight, *flip)

    with pytest.raises(CheckpointIntegrityError) as caught:
        DistributedCheckpointer(tmp_path).load(_empty_state())
    message = str(caught.value)
    assert "checkpoint iteration 2 is corrupted" in message and caught.value.iteration == 2
    assert f"{iter2}/__0_0.distcp" in message and "'model.0.weight@[0, 0]'" in message
    assert "fails its CRC-32 check" in message
    assert f"iteration 1 ({tmp_path / 'iter_0000001'})" in message and "do not resume iteration 2" in message

    # unchecked (verify=False), the flipped weight loads as it is: what a resume trained on before
    loaded = _empty_state()
    DistributedCheckpointer(tmp_path, verify=False).load(loaded)
    got, want = loaded["model"][0].weight.flatten()[0].item(), state["model"][0].weight.flatten()[0].item()
    assert got != want
    # the previous checkpoint, which the error names, loads checked
    assert DistributedCheckpointer(tmp_path).load(_empty_state(), iteration=1) == 1


def test_a_checkpoint_whose_digest_file_is_gone_is_refused_and_one_saved_without_digests_loads(
    tmp_path: Path,
) -> None:
    state = _state()
    DistributedCheckpointer(tmp_path).save(state, 1)
    (tmp_path / "iter_0000001" / CHECKSUMS_FILENAME).unlink()
    with pytest.raises(CheckpointIntegrityError, match=rf"has no {CHECKSUMS_FILENAME}, which its save wrote"):
        DistributedCheckpointer(tmp_path).load(_empty_state())
    # a checkpoint that records no digests (saved before them, or by another tool) is read unchecked
    info = tmp_path / "iter_0000001" / "mm_checkpoint.json"
    info.write_text(json.dumps({k: v for k, v in json.loads(info.read_text()).items() if k != "checksums"}))
    assert DistributedCheckpointer(tmp_path).load(_empty_state()) == 1


def test_a_corrupted_per_rank_state_file_is_named_as_corrupted(tmp_path: Path) -> None:
    DistributedCheckpointer(tmp_path).save({**_state(), "position": {"order": torch.arange(256)}}, 1)
    path = tmp_path / "iter_0000001" / "rank_state" / "dp_rank_00000.pt"
    data = bytearray(path.read_bytes())
    data[data.index(torch.arange(256).numpy().tobytes()) + 9] ^= 0x04  # inside the tensor's record
    path.write_bytes(bytes(data))
    with pytest.raises(
        CheckpointIntegrityError, match=rf"(?s)iteration 1 is corrupted: {path}: record .* CRC-32"
    ):
        DistributedCheckpointer(tmp_path).load({**_empty_state(), "position": {}})


def test_a_damaged_zip_record_read_unchecked_is_named_instead_of_torchs_miniz_message(tmp_path: Path) -> None:
    state = _state()
    DistributedCheckpointer(tmp_path).save(state, 1)
    iter1 = tmp_path / "iter_0000001"
    digest = next(d for d in read_checksums(iter1).values() if d.key.startswith("model.0.weight@"))
    path = iter1 / digest.file
    data = bytearray(path.read_bytes())
    end = digest.offset + digest.length
    data[end - 22 : end - 18] = b"\0\0\0\0"  # the item's end-of-central-directory signature
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointIntegrityError) as caught:
        DistributedCheckpointer(tmp_path, verify=False).load(_empty_state())
    assert "corrupted zip structure" in str(caught.value) and str(iter1) in str(caught.value)
    assert "miniz" not in str(caught.value)


def test_export_and_mm_ckpt_refuse_a_corrupted_checkpoint_and_leave_no_partial_export(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    state = _state()
    root = tmp_path / "run"
    DistributedCheckpointer(root).save(state, 1)
    _flip(root / "iter_0000001", "model.1.weight", state["model"][1].weight, *MANTISSA)
    out = tmp_path / "export"
    with pytest.raises(CheckpointIntegrityError, match=r"'model\.1\.weight@\[0, 0\]' fails its CRC-32"):
        export_checkpoint(root, out, to="hf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no .export.partial-export, no export
    assert mm_ckpt(["convert", str(root), str(out), "--to", "hf"]) == 2
    assert "fails its CRC-32 check" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    assert mm_ckpt(["check", str(root)]) == 1
    assert capsys.readouterr().out.startswith("CORRUPTED: ")


def test_mm_ckpt_check_passes_a_whole_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    DistributedCheckpointer(tmp_path).save(_state(), 1)
    assert mm_ckpt(["check", str(tmp_path)]) == 0
    assert "1 per-rank state files match their CRC-32: OK" in capsys.readouterr().out


def test_a_failed_save_removes_its_partial_dir_sync_and_in_the_background(tmp_path: Path) -> None:
    class Unwritable:  # copied fine (staging), refused when the writer serializes it
        def __deepcopy__(self, memo: dict) -> Unwritable:
            return Unwritable()

        def __reduce__(self):
            raise RuntimeError("this object cannot be written")

    class BadScheduler:
        def state_dict(self) -> dict:
            return {"bad": Unwritable()}

    state = _state()
    ckpt = DistributedCheckpointer(tmp_path)
    ckpt.save(state, 1)
    with pytest.raises(BaseException, match="cannot be written"):
        ckpt.save({**state, "lr_scheduler": BadScheduler()}, 2)
    assert sorted(p.name for p in tmp_path.glob("iter_*")) == ["iter_0000001"]
    ckpt.save({**state, "lr_scheduler": BadScheduler()}, 3, background=True)
    with pytest.raises(CheckpointError, match=r"(?s)background save of iteration 3 .* failed: .*removed"):
        ckpt.finish_pending()
    assert sorted(p.name for p in tmp_path.glob("iter_*")) == ["iter_0000001"]
    assert latest_iteration(tmp_path) == 1


def test_retention_keeps_the_milestones_an_earlier_keep_every_kept_unless_told_to_delete_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = _state()
    first = DistributedCheckpointer(tmp_path, keep_last=1, keep_every=2)
    for it in (1, 2, 3, 4, 5):
        first.save(state, it)
    assert sorted(p.name for p in tmp_path.glob("iter_*")) == ["iter_0000002", "iter_0000004", "iter_0000005"]

    resumed = DistributedCheckpointer(tmp_path, keep_last=1)  # keep_every dropped on resume
    with caplog.at_level("WARNING", logger="mm_checkpoint.checkpointer"):
        resumed.save(state, 6)
    assert sorted(p.name for p in tmp_path.glob("iter_*")) == ["iter_0000002", "iter_0000004", "iter_0000006"]
    assert (
        "keeping ['iter_0000002', 'iter_0000004']" in caplog.text
        and "--prune-kept-checkpoints" in caplog.text
    )

    told = DistributedCheckpointer(tmp_path, keep_last=1, prune_kept=True)
    told.save(state, 7)
    assert sorted(p.name for p in tmp_path.glob("iter_*")) == ["iter_0000007"]


@pytest.mark.slow
def test_a_checkpoint_saved_at_two_ranks_and_loaded_at_one_checks_the_items_as_saved(
    distributed, tmp_path: Path
) -> None:
    def body(rank: int, world: int) -> None:
        from torch.distributed.fsdp import fully_shard

        torch.manual_seed(0)
        model = fully_shard(nn.Linear(64, 64))
        DistributedCheckpointer(tmp_path).save({"model": model}, 1)

    distributed(body, 2)
    iter1 = tmp_path / "iter_0000001"
    second = next(d for d in read_checksums(iter1).values() if d.file == "__1_0.distcp" and "weight" in d.key)
    assert second.key == "model.weight@[32, 0]"  # rank 1's rows: the item as saved
    data = bytearray((iter1 / second.file).read_bytes())
    data[second.offset + second.length - 64] ^= 0x10
    (iter1 / second.file).write_bytes(bytes(data))
    with pytest.raises(CheckpointIntegrityError, match=r"__1_0\.distcp .*'model\.weight@\[32, 0\]' fails"):
        DistributedCheckpointer(tmp_path).load({"model": nn.Linear(64, 64)})  # one rank reads both shards


def test_a_safetensors_file_whose_source_fails_mid_write_leaves_no_partial_file(tmp_path: Path) -> None:
    from mm_checkpoint.dcp_io import DcpReader
    from mm_checkpoint.safetensors_io import (
        PendingTensor,
        TensorInfo,
        save_safetensors,
        write_safetensors_file,
    )

    state = _state()
    DistributedCheckpointer(tmp_path / "run").save(state, 1)
    _flip(tmp_path / "run" / "iter_0000001", "model.1.weight", state["model"][1].weight, *EXPONENT)
    reader = DcpReader(tmp_path / "run" / "iter_0000001")
    pending = [
        PendingTensor(
            key, TensorInfo(reader.info(key).shape, reader.info(key).dtype), lambda k=key: reader.read(k)
        )
        for key in ("0.weight", "1.weight")
    ]
    target = tmp_path / "out.safetensors"
    save_safetensors({"x": torch.ones(2)}, target)  # an older file there stays as it was
    with pytest.raises(CheckpointIntegrityError, match="model.1.weight"):
        for _ in write_safetensors_file(target, pending):
            pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.safetensors", "run"]
