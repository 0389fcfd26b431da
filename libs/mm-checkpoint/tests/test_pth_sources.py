"""``.pth`` state dicts as weights sources: read with ``torch.load(weights_only=True, mmap=True)``, a
crafted pickle refused naming the file with nothing run, the same online conversion cache and source
fingerprint as safetensors, and ``mm-ckpt convert`` of a ``.pth`` alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from mm_checkpoint import (
    CheckpointFormatError,
    CheckpointIntegrityError,
    PthReader,
    load_checkpoint_with_conversion,
    resolve_load_format,
)
from mm_checkpoint.cli import main
from mm_checkpoint.dcp_io import DcpReader
from mm_checkpoint.source_identity import source_identity  # the package attribute is the submodule
from torch import nn


def _linear_pth(path: Path, seed: int = 0) -> tuple[nn.Linear, Path]:
    torch.manual_seed(seed)
    model = nn.Linear(4, 6)
    torch.save(model.state_dict(), path)
    return model, path


def test_a_pth_sniffs_as_pth_and_loads_strictly_into_a_module(tmp_path):
    source, path = _linear_pth(tmp_path / "weights.pth")
    assert resolve_load_format(path) == "pth"
    model = nn.Linear(4, 6)
    report = load_checkpoint_with_conversion(model, path)
    assert report.format == "pth" and sorted(report.loaded) == ["bias", "weight"]
    assert torch.equal(model.weight, source.weight) and torch.equal(model.bias, source.bias)


def test_a_crafted_pth_runs_nothing_and_is_refused_naming_it(tmp_path, pickle_payload, capsys):
    marker, path = tmp_path / "pwned", tmp_path / "Wan2.1_VAE.pth"
    torch.save({"weight": torch.zeros(2), "payload": pickle_payload(marker)}, path)
    with pytest.raises(CheckpointFormatError, match=rf"{path}.*weights_only.*nothing in it was run"):
        load_checkpoint_with_conversion(nn.Linear(1, 2), path)
    assert main(["inspect", str(path)]) == 2
    assert str(path) in capsys.readouterr().err
    assert not marker.exists()


def test_a_file_torch_cannot_memory_map_is_refused_with_how_to_resave_it(tmp_path):
    path = tmp_path / "old.pth"
    torch.save({"w": torch.ones(2)}, path, _use_new_zipfile_serialization=False)
    with pytest.raises(
        CheckpointFormatError, match=r"old\.pth is a legacy \(pre-zip\) torch checkpoint.*re-save"
    ):
        PthReader(path)


def test_a_truncated_pth_is_called_truncated_not_a_legacy_file(tmp_path):
    _, path = _linear_pth(tmp_path / "weights.pth")
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # an interrupted copy
    with pytest.raises(CheckpointIntegrityError, match=r"weights\.pth: .* the file is truncated") as caught:
        PthReader(path)
    assert "legacy" not in str(caught.value) and "re-save" not in str(caught.value)


@pytest.mark.parametrize(
    "damage",
    [(b"PK\x01\x02", b"PX\x01\x02"), (b"PK\x03\x04", b"PX\x03\x04")],
    ids=["central-directory", "record-header"],
)
def test_a_pth_with_a_corrupted_zip_structure_is_named_without_torchs_miniz_message(tmp_path, damage):
    _, path = _linear_pth(tmp_path / "weights.pth")
    raw = path.read_bytes()
    path.write_bytes(raw[:4] + raw[4:].replace(*damage, 1))  # the first record header kept: still a zip
    with pytest.raises(
        CheckpointIntegrityError, match=r"weights\.pth: its zip structure is corrupted"
    ) as caught:
        PthReader(path)
    assert "miniz" not in str(caught.value)


def test_a_shard_reads_only_its_rows(tmp_path):
    torch.save({"w": torch.arange(24.0).reshape(6, 4)}, tmp_path / "w.pth")
    with PthReader(tmp_path / "w.pth") as reader:
        assert reader.info("w").shape == (6, 4)
        assert torch.equal(reader.read("w", (slice(2, 4),)), torch.arange(8.0, 16.0).reshape(2, 4))


def test_the_online_conversion_of_a_pth_is_cached_and_redone_when_the_file_changes(tmp_path):
    source, path = _linear_pth(tmp_path / "weights.pth")
    cache = tmp_path / "cache"
    first = load_checkpoint_with_conversion(nn.Linear(4, 6), path, fmt="dcp", conversion_dir=cache)
    assert first.converted_from == str(path)
    again = load_checkpoint_with_conversion(nn.Linear(4, 6), path, fmt="dcp", conversion_dir=cache)
    assert again.converted_from is None  # the recorded identity matches: reused
    before = source_identity(path)
    changed, _ = _linear_pth(path, seed=1)
    assert source_identity(path) != before
    model = nn.Linear(4, 6)
    assert load_checkpoint_with_conversion(
        model, path, fmt="dcp", conversion_dir=cache
    ).converted_from == str(path)
    assert torch.equal(model.weight, changed.weight)


def test_mm_ckpt_converts_a_pth_to_dcp_through_a_key_map(tmp_path, capsys):
    path = tmp_path / "models_t5_umt5-xxl-enc-bf16.pth"
    torch.save({"norm.weight": torch.ones(3), "blocks.0.attn.q.weight": torch.eye(3)}, path)
    assert main(["convert", str(path), str(tmp_path / "dcp"), "--to", "dcp", "--model-type", "umt5"]) == 0
    keys = DcpReader(tmp_path / "dcp" / "iter_0000000").keys()
    assert sorted(keys) == [
        "encoder.block.0.layer.0.SelfAttention.q.weight",
        "encoder.final_layer_norm.weight",
    ]
