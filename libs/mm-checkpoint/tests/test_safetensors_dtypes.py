"""Every safetensors dtype is read: torch's own element types as tensors, the sub-byte ones by size."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from mm_checkpoint import CheckpointFormatError, summarize
from mm_checkpoint.cli import main
from mm_checkpoint.safetensors_io import SafetensorsReader

# safetensors dtype -> (shape, bytes): every dtype the format defines
DTYPES = {
    "BOOL": ((3,), 3), "U8": ((3,), 3), "I8": ((3,), 3), "U16": ((3,), 6), "I16": ((3,), 6),
    "F16": ((3,), 6), "BF16": ((3,), 6), "U32": ((3,), 12), "I32": ((3,), 12), "F32": ((3,), 12),
    "U64": ((3,), 24), "I64": ((3,), 24), "F64": ((3,), 24), "C64": ((3,), 24),
    "F8_E4M3": ((3,), 3), "F8_E5M2": ((3,), 3), "F8_E8M0": ((3,), 3),
    "F4": ((2, 5), 5), "F6_E2M3": ((4,), 3), "F6_E3M2": ((4,), 3),
}  # fmt: skip


def _write(path: Path, tensors: dict[str, tuple[str, tuple[int, ...], bytes]]) -> Path:
    header, offset = {}, 0
    for key, (dtype, shape, data) in tensors.items():
        header[key] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    raw = json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + b"".join(d for _, _, d in tensors.values()))
    return path


@pytest.fixture
def every_dtype(tmp_path: Path) -> Path:
    data = {f"t_{d.lower()}": (d, shape, bytes(range(1, n + 1))) for d, (shape, n) in DTYPES.items()}
    return _write(tmp_path / "model.safetensors", data)


def test_inspect_counts_every_dtype_and_its_bytes(every_dtype: Path, capsys: pytest.CaptureFixture) -> None:
    summary = summarize(every_dtype)
    assert summary.tensors == len(DTYPES)
    assert summary.total_bytes == sum(n for _, n in DTYPES.values())
    assert {"uint16", "uint32", "uint64", "float8_e8m0fnu", "F4", "F6_E2M3"} <= set(summary.dtypes)
    assert main(["inspect", str(every_dtype)]) == 0


@pytest.mark.parametrize("dtype", ["U16", "U32", "U64", "F8_E8M0"])
def test_unsigned_and_e8m0_tensors_read_back_their_bytes(every_dtype: Path, dtype: str) -> None:
    shape, n = DTYPES[dtype]
    tensor = SafetensorsReader(every_dtype).read(f"t_{dtype.lower()}")
    assert tuple(tensor.shape) == shape and math.prod(shape) * tensor.element_size() == n
    assert tensor.view(torch.uint8).tolist() == list(range(1, n + 1))


def test_reading_a_sub_byte_tensor_names_it_and_its_dtype(every_dtype: Path) -> None:
    with pytest.raises(CheckpointFormatError, match=r"'t_f4' is F4, which torch has no element type for"):
        SafetensorsReader(every_dtype).read("t_f4")


def test_data_offsets_that_disagree_with_shape_and_dtype_are_refused(tmp_path: Path) -> None:
    bad = _write(tmp_path / "model.safetensors", {"w": ("U32", (3,), bytes(8))})
    with pytest.raises(CheckpointFormatError, match=r"'w' \(U32, shape \[3\]\) needs 12 bytes"):
        SafetensorsReader(bad)
