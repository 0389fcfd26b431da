"""load_checkpoint_with_conversion into plain and meta-initialized upstream models."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from mm_checkpoint import (
    KEY_MAP_REGISTRY,
    CheckpointLoadError,
    CheckpointNotFoundError,
    KeyMapTransform,
    RenameRule,
    load_checkpoint_with_conversion,
    register_weight_transform,
)
from safetensors.torch import load_file, save_file
from torch import nn


@pytest.mark.parametrize(
    ("name", "fixture", "fmt"),
    [("wan", "wan_dir", "diffusers"), ("vae", "vae_dir", "diffusers"), ("umt5", "umt5_dir", "hf")],
)
def test_meta_model_loads_bit_exact(
    name: str, fixture: str, fmt: str, tiny: Any, request: pytest.FixtureRequest
) -> None:
    path = request.getfixturevalue(fixture)
    factory = getattr(tiny, name)
    model = tiny.meta(factory)
    report = load_checkpoint_with_conversion(model, path)
    assert report.format == fmt and report.complete and report.loaded
    tiny.assert_same_state(factory(), model)


def test_tied_weights_stay_tied_after_meta_load(umt5_dir: Path, tiny: Any) -> None:
    model = tiny.meta(tiny.umt5)
    load_checkpoint_with_conversion(model, umt5_dir)
    assert model.encoder.embed_tokens.weight is model.shared.weight


def test_meta_non_persistent_buffers_are_reported(wan_dir: Path, tiny: Any) -> None:
    report = load_checkpoint_with_conversion(tiny.meta(tiny.wan), wan_dir)
    assert report.uninitialized_buffers == ["rope.freqs_cos", "rope.freqs_sin"]


def test_values_are_cast_to_parameter_dtype(umt5_dir: Path, tiny: Any) -> None:
    model = tiny.umt5().to(torch.bfloat16)
    nn.init.zeros_(model.shared.weight)
    load_checkpoint_with_conversion(model, umt5_dir)
    assert model.shared.weight.dtype == torch.bfloat16
    assert torch.equal(model.shared.weight, tiny.umt5().shared.weight.to(torch.bfloat16))


class _Tiny(nn.Module):
    def __init__(self, extra: bool = False, width: int = 3) -> None:
        super().__init__()
        self.lin = nn.Linear(2, width)
        self.register_buffer("running", torch.zeros(2))
        self.register_buffer("scratch", torch.zeros(1), persistent=False)
        if extra:
            self.extra = nn.Parameter(torch.zeros(1))


def _save(module: nn.Module, path: Path) -> Path:
    path.mkdir()
    save_file(module.state_dict(), str(path / "model.safetensors"))
    return path


def test_missing_unexpected_and_mismatched_keys_are_named(tmp_path: Path) -> None:
    ckpt = _save(_Tiny(), tmp_path / "ckpt")
    with pytest.raises(CheckpointLoadError, match=r"1 missing: \['extra'\]"):
        load_checkpoint_with_conversion(_Tiny(extra=True), ckpt)
    report = load_checkpoint_with_conversion(_Tiny(width=4), ckpt, strict=False)
    assert sorted(report.mismatched) == ["lin.bias", "lin.weight"]
    assert "(3, 2)" in report.details["lin.weight"] and "(4, 2)" in report.details["lin.weight"]
    report = load_checkpoint_with_conversion(_Tiny(extra=True), _save(_Tiny(extra=True), tmp_path / "b"))
    assert (
        report.complete and "scratch" not in report.loaded + report.missing
    )  # non-persistent buffer ignored
    with pytest.raises(CheckpointLoadError, match=r"unexpected: \['extra'\]"):
        load_checkpoint_with_conversion(_Tiny(), tmp_path / "b")


def test_registered_rename_table_maps_checkpoint_keys(tmp_path: Path, tiny: Any) -> None:
    table = KeyMapTransform([RenameRule(r"^blocks\.(\d+)\.attn1\.", r"blocks.\1.attn1."),
                             RenameRule(r"^legacy_blocks\.(\d+)\.", r"blocks.\1.")])  # fmt: skip
    register_weight_transform("toy_loader", table)
    try:
        reference = tiny.wan()
        renamed = {k.replace("blocks.", "legacy_blocks.", 1): v for k, v in reference.state_dict().items()}
        src = tmp_path / "legacy"
        src.mkdir()
        save_file(
            {k: v.contiguous() for k, v in renamed.items()}, str(src / "diffusion_pytorch_model.safetensors")
        )
        model = tiny.meta(tiny.wan)
        report = load_checkpoint_with_conversion(model, src, model_type="toy_loader")
        assert report.complete
        tiny.assert_same_state(reference, model)
    finally:
        KEY_MAP_REGISTRY.pop("toy_loader")


def test_single_safetensors_file_path_loads(tmp_path: Path, tiny: Any) -> None:
    ref = _Tiny()
    file = _save(ref, tmp_path / "x") / "model.safetensors"
    model = _Tiny()
    load_checkpoint_with_conversion(model, file)
    tiny.assert_same_state(ref, model)
    assert load_file(str(file)).keys() == ref.state_dict().keys()


def test_missing_path_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointNotFoundError, match="does not exist"):
        load_checkpoint_with_conversion(_Tiny(), tmp_path / "nope", fmt="hf")


def test_a_load_whose_source_keys_carry_a_prefix_names_it_and_the_tensors_it_leaves(tmp_path):
    """A DDP-style save (``module.`` in front of every key) plus one stray tensor: the error says so in
    one line instead of leaving the reader to compare two lists of keys."""
    from mm_checkpoint import save_safetensors

    state = {f"module.{k}": v for k, v in nn.Linear(3, 5).state_dict().items()} | {"step": torch.zeros(1)}
    save_safetensors(state, tmp_path / "ddp.safetensors")
    with pytest.raises(CheckpointLoadError) as info:
        load_checkpoint_with_conversion(nn.Linear(3, 5), tmp_path / "ddp.safetensors")
    assert (
        "2 of the 2 missing keys are in the source under the prefix `module.`, which the model's keys do not "
        "have; its other 1 tensors are not the model's: ['step']"
    ) in str(info.value)
