"""Safetensors headers are held to the official reader's rules: a file that ``safetensors.safe_open``
refuses is refused here too, with one message naming the file (exit 2 in ``mm-ckpt``), never read."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import safetensors
from mm_checkpoint.cli import main
from mm_checkpoint.safetensors_io import SafetensorsReader

F32_2 = {"dtype": "F32", "shape": [2]}  # 8 bytes


def _write(path: Path, header: dict | bytes, data: bytes) -> Path:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


CASES = {
    "negative offset (reads the header's own bytes)": ({"a": {**F32_2, "data_offsets": [-8, 0]}}, b""),
    "overlapping offsets": (
        {"a": {**F32_2, "data_offsets": [0, 8]}, "b": {**F32_2, "data_offsets": [4, 12]}},
        bytes(12),
    ),
    "a gap between tensors": (
        {"a": {**F32_2, "data_offsets": [0, 8]}, "b": {**F32_2, "data_offsets": [12, 20]}},
        bytes(20),
    ),
    "a first tensor not at offset 0": ({"a": {**F32_2, "data_offsets": [4, 12]}}, bytes(12)),
    "offsets given as strings": ({"a": {**F32_2, "data_offsets": ["0", "8"]}}, bytes(8)),
    "a shape given as strings": ({"a": {"dtype": "F32", "shape": ["2"], "data_offsets": [0, 8]}}, bytes(8)),
    "a dtype that is not a string": (
        {"a": {"dtype": ["F32"], "shape": [2], "data_offsets": [0, 8]}},
        bytes(8),
    ),
    "an entry that is not an object": ({"a": [0, 8]}, bytes(8)),
    "metadata values that are not strings": (
        {"__metadata__": {"step": 3}, "a": {**F32_2, "data_offsets": [0, 8]}},
        bytes(8),
    ),
    "a header that is a JSON list": (b'[{"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}]', bytes(8)),
    "a header that is not UTF-8": (
        b'{"\xff": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}',
        bytes(8),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_header_the_official_reader_refuses_is_refused_with_exit_2_naming_the_file(case, tmp_path, capsys):
    path = _write(tmp_path / "model.safetensors", *CASES[case])
    with pytest.raises(Exception):  # noqa: B017,PT011 - the reference: any refusal of the official reader
        safetensors.safe_open(str(path), "pt")
    assert main(["inspect", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mm-ckpt: error:") and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert str(path) in err


def test_a_header_length_beyond_the_official_limit_is_refused_naming_the_file(tmp_path, capsys):
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", 100_000_001) + b"{}")
    assert main(["inspect", str(path)]) == 2
    assert f"{path} is not a valid safetensors file (bad header: its header length" in capsys.readouterr().err


def test_tensors_listed_out_of_offset_order_but_tiling_the_buffer_are_read_as_the_official_reader_reads_them(
    tmp_path,
):
    data = struct.pack("<4f", 1, 2, 3, 4)
    header = {"b": {**F32_2, "data_offsets": [8, 16]}, "a": {**F32_2, "data_offsets": [0, 8]}}
    path = _write(tmp_path / "model.safetensors", header, data)
    with safetensors.safe_open(str(path), "pt") as official, SafetensorsReader(path) as ours:
        for key in ("a", "b"):
            assert ours.read(key).tolist() == official.get_tensor(key).tolist()
