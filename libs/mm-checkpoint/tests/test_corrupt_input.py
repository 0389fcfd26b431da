"""``mm-ckpt`` on damaged checkpoints: missing or truncated shards and corrupt metadata / index exit 2
with one message (no traceback); ``verify`` sees NaN differences."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from mm_checkpoint import DistributedCheckpointer, convert_to_dcp
from mm_checkpoint.cli import main
from safetensors.torch import save_file
from torch import nn


def _dcp_root(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    DistributedCheckpointer(tmp_path / "ckpt").save({"model": nn.Linear(8, 8)}, iteration=1)
    return tmp_path / "ckpt"


def _one_error_line(capsys: pytest.CaptureFixture) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("mm-ckpt: error:") and "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


def test_inspect_of_a_truncated_dcp_shard_exits_2_naming_it(tmp_path: Path, capsys) -> None:
    root = _dcp_root(tmp_path)
    shard = next((root / "iter_0000001").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:100])
    assert main(["inspect", str(root)]) == 2
    assert f"{shard.name} is truncated" in _one_error_line(capsys)


def test_inspect_of_a_missing_dcp_shard_exits_2_naming_it(tmp_path: Path, capsys) -> None:
    root = _dcp_root(tmp_path)
    shard = next((root / "iter_0000001").glob("*.distcp"))
    shard.unlink()
    assert main(["inspect", str(root)]) == 2
    assert f"{shard.name} is missing" in _one_error_line(capsys)


def test_inspect_of_corrupt_dcp_metadata_exits_2_naming_it(tmp_path: Path, capsys) -> None:
    root = _dcp_root(tmp_path)
    metadata = root / "iter_0000001" / ".metadata"
    metadata.write_bytes(metadata.read_bytes()[:40])
    assert main(["inspect", str(root)]) == 2
    assert f"{metadata} is not readable DCP metadata" in _one_error_line(capsys)


def _sharded_safetensors(tmp_path: Path) -> Path:
    out = tmp_path / "st"
    out.mkdir()
    save_file({"a": torch.ones(16)}, str(out / "model-00001-of-00002.safetensors"))
    save_file({"b": torch.ones(16)}, str(out / "model-00002-of-00002.safetensors"))
    weight_map = {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}
    (out / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return out


def test_inspect_of_a_truncated_safetensors_shard_exits_2_naming_it(tmp_path: Path, capsys) -> None:
    shard = _sharded_safetensors(tmp_path) / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-8])
    assert main(["inspect", str(shard.parent)]) == 2
    assert f"{shard} is truncated" in _one_error_line(capsys)


def test_inspect_of_a_shard_missing_from_the_index_exits_2_naming_it(tmp_path: Path, capsys) -> None:
    shard = _sharded_safetensors(tmp_path) / "model-00002-of-00002.safetensors"
    shard.unlink()
    assert main(["inspect", str(shard.parent)]) == 2
    assert shard.name in _one_error_line(capsys)


def test_inspect_of_a_corrupt_index_exits_2_naming_it(tmp_path: Path, capsys) -> None:
    index = _sharded_safetensors(tmp_path) / "model.safetensors.index.json"
    index.write_text('{"weight_map": ')
    assert main(["inspect", str(index.parent)]) == 2
    assert f"{index} is not a valid safetensors index" in _one_error_line(capsys)


def _pair(tmp_path: Path, a: torch.Tensor, b: torch.Tensor) -> tuple[Path, Path]:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    save_file({"w": a, "same": torch.ones(3)}, str(tmp_path / "a" / "model.safetensors"))
    save_file({"w": b, "same": torch.ones(3)}, str(tmp_path / "b" / "model.safetensors"))
    return tmp_path / "a", tmp_path / "b"


def test_verify_calls_an_all_nan_tensor_different(tmp_path: Path, capsys) -> None:
    a, b = _pair(tmp_path, torch.zeros(4), torch.full((4,), float("nan")))
    assert main(["verify", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "NaN in one only (1): ['w']" in out and out.strip().endswith("DIFFERENT")


def test_verify_calls_an_all_nan_difference_through_dcp_different(tmp_path: Path, capsys) -> None:
    a, b = _pair(tmp_path, torch.zeros(4), torch.full((4,), float("nan")))
    convert_to_dcp(b, tmp_path / "b_dcp")
    assert main(["verify", str(a), str(tmp_path / "b_dcp"), "--atol", "1e9"]) == 1
    assert capsys.readouterr().out.strip().endswith("DIFFERENT")


def test_verify_calls_nan_and_inf_at_the_same_places_same(tmp_path: Path, capsys) -> None:
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), 1.0])
    a, b = _pair(tmp_path, special, special.clone())
    assert main(["verify", str(a), str(b)]) == 0
    assert capsys.readouterr().out.strip().endswith("SAME")


def test_verify_of_a_corrupt_dcp_shard_exits_2_naming_the_checkpoint(tmp_path: Path, capsys) -> None:
    root = _dcp_root(tmp_path)
    shard = next((root / "iter_0000001").glob("*.distcp"))
    shard.write_bytes(b"\0" * shard.stat().st_size)  # right size, garbage content
    assert main(["verify", str(root), str(root)]) == 2
    line = _one_error_line(capsys)
    assert str(shard) in line and "fails its CRC-32 check" in line
