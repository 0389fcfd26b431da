"""Lazy safetensors reads (whole tensors and shard slices) and the streaming sharded writer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from mm_checkpoint.errors import CheckpointFormatError
from mm_checkpoint.safetensors_io import (
    PendingTensor,
    SafetensorsReader,
    TensorInfo,
    parse_size,
    plan_shards,
    save_safetensors,
    write_safetensors_file,
)
from safetensors.torch import load_file, save_file

TENSORS = {
    "a": torch.randn(5, 3, 4),
    "scalar": torch.tensor(3.0),
    "ints": torch.arange(10, dtype=torch.int16),
    "empty": torch.zeros(0, 3),
    "half": torch.randn(4, 6).to(torch.bfloat16),
}


@pytest.fixture
def st_dir(tmp_path: Path) -> Path:
    save_file(TENSORS, str(tmp_path / "model.safetensors"))
    return tmp_path


@pytest.mark.parametrize("zero_copy", [False, True])
def test_whole_tensors_read_back_exactly(st_dir: Path, zero_copy: bool) -> None:
    with SafetensorsReader(st_dir, zero_copy=zero_copy) as reader:
        for key, value in TENSORS.items():
            got = reader.read(key)
            assert got.dtype == value.dtype and torch.equal(got, value), key


@pytest.mark.parametrize(
    "index",
    [(slice(1, 3),), (slice(1, 3), slice(1, 2)), (slice(0, 5), slice(0, 3), slice(2, 4)), (slice(5, 5),)],
)
def test_slices_equal_indexing_the_full_tensor(st_dir: Path, index: tuple[slice, ...]) -> None:
    with SafetensorsReader(st_dir) as reader:
        assert torch.equal(reader.read("a", index), TENSORS["a"][index])


def test_info_reports_shape_and_dtype_without_reading(st_dir: Path) -> None:
    with SafetensorsReader(st_dir) as reader:
        assert reader.info("half") == TensorInfo((4, 6), torch.bfloat16)


def test_unknown_key_names_the_checkpoint(st_dir: Path) -> None:
    with SafetensorsReader(st_dir) as reader, pytest.raises(KeyError, match="'nope' not found.*"):
        reader.read("nope")


def test_corrupt_file_is_a_format_error(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{oops")
    with pytest.raises(CheckpointFormatError, match="bad header"):
        SafetensorsReader(tmp_path)


def test_streaming_writer_output_loads_with_safetensors_and_is_aligned(tmp_path: Path) -> None:
    pending = [
        PendingTensor(k, TensorInfo(tuple(v.shape), v.dtype), lambda v=v: v) for k, v in TENSORS.items()
    ]
    out = tmp_path / "x.safetensors"
    assert list(write_safetensors_file(out, pending)) == list(TENSORS)
    loaded = load_file(str(out))
    assert all(torch.equal(loaded[k], v) for k, v in TENSORS.items())
    assert (int.from_bytes(out.read_bytes()[:8], "little") + 8) % 64 == 0


def test_writer_rejects_tensor_that_differs_from_plan(tmp_path: Path) -> None:
    bad = [PendingTensor("w", TensorInfo((2,), torch.float32), lambda: torch.zeros(3))]
    with pytest.raises(CheckpointFormatError, match=r"'w' came out as \(3,\)"):
        list(write_safetensors_file(tmp_path / "x.safetensors", bad))


def test_plan_shards_respects_max_size_in_order() -> None:
    def t(name: str, n: int) -> PendingTensor:
        return PendingTensor(name, TensorInfo((n,), torch.uint8), lambda: torch.zeros(n, dtype=torch.uint8))

    shards = plan_shards([t("a", 60), t("b", 50), t("c", 200), t("d", 10)], max_shard_size=100)
    assert [[p.key for p in s] for s in shards] == [["a"], ["b"], ["c"], ["d"]]
    assert parse_size("5GB") == 5 * 10**9 and parse_size("2GiB") == 2 * 2**30 and parse_size(7) == 7


def test_save_safetensors_writes_string_metadata_that_safetensors_reads(tmp_path: Path) -> None:
    from safetensors import safe_open

    path = save_safetensors(
        {"w": torch.arange(6.0).view(2, 3)}, tmp_path / "m.safetensors", {"k": '{"r": 4}'}
    )
    with safe_open(str(path), framework="pt") as f:
        assert f.metadata() == {"format": "pt", "k": '{"r": 4}'}
        assert torch.equal(f.get_tensor("w"), torch.arange(6.0).view(2, 3))
    with pytest.raises(CheckpointFormatError, match="metadata maps strings to strings"):
        save_safetensors({"w": torch.ones(1)}, tmp_path / "bad.safetensors", {"r": 4})  # type: ignore[dict-item]
