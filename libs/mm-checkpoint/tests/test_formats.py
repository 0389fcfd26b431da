"""Format names, sniffing and DCP-directory detection."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from mm_checkpoint import (
    CheckpointFormatError,
    looks_like_dcp_checkpoint_dir,
    normalize_format,
    resolve_load_format,
    sniff_format,
)
from mm_checkpoint.layout import TRACKER_FILENAME


def _dcp_dir(path: Path) -> Path:
    dcp.save({"model": {"w": torch.ones(2)}}, checkpoint_id=str(path), no_dist=True)
    return path


@pytest.mark.parametrize(
    ("declared", "expected"),
    [("torch_dcp", "dcp"), ("DCP", "dcp"), ("huggingface", "hf"), ("transformers", "hf"), ("diffusers", "diffusers"),
     (None, "auto"), ("", "auto"), ("hf-safetensors", "hf"), ("safetensors", "safetensors")],
)  # fmt: skip
def test_normalize_format_accepts_aliases(declared: str | None, expected: str) -> None:
    assert normalize_format(declared) == expected


def test_normalize_format_rejects_unknown_name_listing_valid_ones() -> None:
    with pytest.raises(CheckpointFormatError, match=r"'pickle'.*expected one of.*diffusers"):
        normalize_format("pickle")


def test_sniff_diffusers_hf_and_dcp(wan_dir: Path, vae_dir: Path, umt5_dir: Path, tmp_path: Path) -> None:
    assert sniff_format(wan_dir) == "diffusers"
    assert sniff_format(vae_dir) == "diffusers"
    assert sniff_format(umt5_dir) == "hf"
    assert sniff_format(_dcp_dir(tmp_path / "ckpt")) == "dcp"


def test_sniff_prefers_dcp_over_safetensors_in_same_dir(wan_dir: Path, tmp_path: Path) -> None:
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for f in wan_dir.iterdir():
        (mixed / f.name).write_bytes(f.read_bytes())
    (mixed / TRACKER_FILENAME).write_text("0\n")
    assert sniff_format(mixed) == "dcp"


def test_sniff_unknown_dir_lists_its_entries(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hi")
    (tmp_path / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(CheckpointFormatError, match=r"notes\.txt.*pytorch_model\.bin.*not supported"):
        sniff_format(tmp_path)


def test_sniff_pipeline_root_suggests_component_subfolder(tmp_path: Path) -> None:
    (tmp_path / "model_index.json").write_text("{}")
    (tmp_path / "transformer").mkdir()
    with pytest.raises(CheckpointFormatError, match="transformer/"):
        sniff_format(tmp_path)


def test_declared_format_wins_over_sniffing(umt5_dir: Path) -> None:
    assert resolve_load_format(umt5_dir, "dcp") == "dcp"  # request for online conversion
    assert resolve_load_format(umt5_dir, "safetensors") == "hf"


def test_empty_iter_dir_is_not_dcp(tmp_path: Path) -> None:
    (tmp_path / "iter_0000000").mkdir()
    assert not looks_like_dcp_checkpoint_dir(tmp_path)


def test_iter_dir_with_metadata_is_dcp(tmp_path: Path) -> None:
    _dcp_dir(tmp_path / "iter_0000003")
    assert looks_like_dcp_checkpoint_dir(tmp_path)


def test_tracker_alone_marks_dcp_root(tmp_path: Path) -> None:
    (tmp_path / TRACKER_FILENAME).write_text("7\n")
    assert looks_like_dcp_checkpoint_dir(tmp_path)


def test_distcp_files_mark_dcp_dir(tmp_path: Path) -> None:
    (tmp_path / "__0_0.distcp").write_bytes(b"")
    assert looks_like_dcp_checkpoint_dir(tmp_path)
