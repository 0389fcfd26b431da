"""The online conversion cache remembers its source: another or a changed source is reconverted (with a
log line saying why) instead of training on the cached weights of the old one."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import torch
from mm_checkpoint import (
    KeyMapTransform,
    RenameRule,
    convert_to_dcp,
    load_checkpoint_with_conversion,
    register_weight_transform,
)
from mm_checkpoint.key_map_registry import KEY_MAP_REGISTRY
from safetensors.torch import save_file
from torch import nn


def _source(path: Path, fill: float, prefix: str = "") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    tensors = {f"{prefix}weight": torch.full((4, 4), fill), f"{prefix}bias": torch.full((4,), fill)}
    save_file(tensors, str(path / "model.safetensors"))
    return path


def _load(source: Path, cache: Path, model_type: str | None = None) -> tuple[nn.Module, str | None]:
    with torch.device("meta"):
        model = nn.Linear(4, 4)
    report = load_checkpoint_with_conversion(
        model, source, fmt="dcp", model_type=model_type, conversion_dir=cache
    )
    return model, report.converted_from


def test_an_unchanged_source_reuses_the_cache(tmp_path: Path) -> None:
    source, cache = _source(tmp_path / "a", 1.0), tmp_path / "cache"
    _load(source, cache)
    model, converted_from = _load(source, cache)
    assert converted_from is None and torch.equal(model.weight, torch.ones(4, 4))


def test_another_source_is_reconverted_with_the_reason_logged(tmp_path: Path, caplog) -> None:
    cache = tmp_path / "cache"
    _load(_source(tmp_path / "a", 1.0), cache)
    nan_source = _source(tmp_path / "b", float("nan"))
    with caplog.at_level(logging.WARNING, logger="mm_checkpoint.conversion"):
        model, converted_from = _load(nan_source, cache)
    assert converted_from == str(nan_source)
    assert torch.isnan(model.weight).all()  # the old cache would have given ones: stale weights
    assert "the content of the weight files changed (model.safetensors)" in caplog.text


def test_a_source_rewritten_in_place_is_reconverted(tmp_path: Path, caplog) -> None:
    source, cache = _source(tmp_path / "a", 1.0), tmp_path / "cache"
    _load(source, cache)
    stamp = (source / "model.safetensors").stat().st_mtime_ns
    _source(source, 2.0)  # same names, shapes and sizes; new values
    os.utime(source / "model.safetensors", ns=(stamp + 10**9, stamp + 10**9))  # written a second later
    with caplog.at_level(logging.WARNING, logger="mm_checkpoint.conversion"):
        model, converted_from = _load(source, cache)
    assert converted_from == str(source) and torch.equal(model.weight, torch.full((4, 4), 2.0))
    assert "the weight files changed" in caplog.text


def _rewrite_keeping_size_and_mtime(file: Path, tensors: dict, how: str) -> None:
    """New values, same size; the modification time put back (as a normalised-time archive has it)."""
    stamp = file.stat()
    if how == "replaced":  # written beside and renamed over it: a new inode
        save_file(tensors, str(file.with_suffix(".tmp")))
        os.replace(file.with_suffix(".tmp"), file)
    else:  # the same inode, bytes overwritten
        save_file(tensors, str(file.with_suffix(".tmp")))
        data = file.with_suffix(".tmp").read_bytes()
        file.with_suffix(".tmp").unlink()
        with open(file, "r+b") as f:
            f.write(data)
    os.utime(file, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert (file.stat().st_size, file.stat().st_mtime_ns) == (stamp.st_size, stamp.st_mtime_ns)


@pytest.mark.parametrize("how", ["replaced", "in place"])
def test_a_same_size_same_mtime_rewrite_is_reconverted(how: str, tmp_path: Path, caplog) -> None:
    source, cache = _source(tmp_path / "a", 1.0), tmp_path / "cache"
    _load(source, cache)
    _rewrite_keeping_size_and_mtime(
        source / "model.safetensors", {"weight": torch.full((4, 4), 2.0), "bias": torch.full((4,), 2.0)}, how
    )
    with caplog.at_level(logging.WARNING, logger="mm_checkpoint.conversion"):
        model, converted_from = _load(source, cache)
    assert converted_from == str(source) and torch.equal(model.weight, torch.full((4, 4), 2.0))
    assert "the content of the weight files changed (model.safetensors)" in caplog.text


def test_the_same_bytes_touched_or_moved_reuse_the_cache_and_are_hashed_once(
    tmp_path: Path, monkeypatch
) -> None:
    from mm_checkpoint import source_identity as identity

    hashed: list[str] = []
    sha256_file = identity.sha256_file
    monkeypatch.setattr(
        identity, "sha256_file", lambda path: hashed.append(Path(path).name) or sha256_file(path)
    )
    source, cache = _source(tmp_path / "a", 1.0), tmp_path / "cache"
    _load(source, cache)
    moved = source.rename(tmp_path / "moved")
    os.utime(moved / "model.safetensors", ns=(1, 1))
    assert _load(moved, cache)[1] is None  # same content: no conversion
    assert _load(moved, cache)[1] is None
    assert hashed == ["model.safetensors", "model.safetensors"]  # at the conversion, then once after the move


def test_a_source_with_other_tensors_is_reconverted(tmp_path: Path, caplog) -> None:
    source, cache = _source(tmp_path / "a", 1.0), tmp_path / "cache"
    _load(source, cache)
    _source(source, 3.0, prefix="model.")  # other names: another key map applies
    register_weight_transform("strip_model", KeyMapTransform([RenameRule(r"^model\.", "")]))
    try:
        with caplog.at_level(logging.WARNING, logger="mm_checkpoint.conversion"):
            model, converted_from = _load(source, cache, model_type="strip_model")
    finally:
        KEY_MAP_REGISTRY.pop("strip_model")
    assert converted_from == str(source) and torch.equal(model.bias, torch.full((4,), 3.0))
    for reason in (
        "content of the weight files changed",
        "model type (key map) changed (None -> strip_model)",
    ):
        assert reason in caplog.text


def test_a_cache_that_records_no_source_is_reconverted(tmp_path: Path, caplog) -> None:
    cache = tmp_path / "cache"
    convert_to_dcp(_source(tmp_path / "old", 5.0), cache)  # a cache written without a record
    source = _source(tmp_path / "a", 1.0)
    with caplog.at_level(logging.WARNING, logger="mm_checkpoint.conversion"):
        model, converted_from = _load(source, cache)
    assert converted_from == str(source) and torch.equal(model.weight, torch.ones(4, 4))
    assert "records no source identity" in caplog.text


def test_a_missing_source_that_is_not_the_cached_one_is_an_error(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    _load(_source(tmp_path / "a", 1.0), cache)
    with pytest.raises(
        FileNotFoundError, match=f"{tmp_path / 'typo'} does not exist .*holds {tmp_path / 'a'}"
    ):
        _load(tmp_path / "typo", cache)
