"""Online DCP conversion with cache, file conversion to DCP, and export back to upstream formats."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from mm_checkpoint import (
    KEY_MAP_REGISTRY,
    TRACKER_FILENAME,
    CheckpointFormatError,
    KeyMapTransform,
    RenameRule,
    convert_to_dcp,
    export_checkpoint,
    load_checkpoint_with_conversion,
    register_weight_transform,
)


def test_online_conversion_writes_iteration_zero_and_tracker(
    wan_dir: Path, tmp_path: Path, tiny: Any
) -> None:
    cache = tmp_path / "cache"
    model = tiny.meta(tiny.wan)
    report = load_checkpoint_with_conversion(model, wan_dir, fmt="dcp", conversion_dir=cache)
    assert report.converted_from == str(wan_dir) and report.format == "dcp"
    assert (cache / "iter_0000000" / ".metadata").is_file()
    assert (cache / TRACKER_FILENAME).read_text().strip() == "0"
    assert (cache / "config.json").is_file()
    tiny.assert_same_state(tiny.wan(), model)


def test_second_run_reuses_cache_without_reading_source(wan_dir: Path, tmp_path: Path, tiny: Any) -> None:
    source, cache = tmp_path / "src", tmp_path / "cache"
    shutil.copytree(wan_dir, source)
    load_checkpoint_with_conversion(tiny.meta(tiny.wan), source, fmt="dcp", conversion_dir=cache)
    shutil.rmtree(source)  # a second run must not touch it
    model = tiny.meta(tiny.wan)
    report = load_checkpoint_with_conversion(model, source, fmt="dcp", conversion_dir=cache)
    assert report.converted_from is None
    tiny.assert_same_state(tiny.wan(), model)


def test_interrupted_conversion_is_redone(umt5_dir: Path, tmp_path: Path, tiny: Any) -> None:
    cache = tmp_path / "cache"
    (cache / "iter_0000000").mkdir(parents=True)  # what a killed conversion leaves behind
    model = tiny.meta(tiny.umt5)
    report = load_checkpoint_with_conversion(model, umt5_dir, fmt="dcp", conversion_dir=cache)
    assert report.converted_from == str(umt5_dir)
    tiny.assert_same_state(tiny.umt5(), model)


def test_declared_dcp_without_conversion_dir_is_an_error(umt5_dir: Path, tiny: Any) -> None:
    with pytest.raises(CheckpointFormatError, match="checkpoint_conversion_dir"):
        load_checkpoint_with_conversion(tiny.meta(tiny.umt5), umt5_dir, fmt="dcp")


def test_diffusers_dcp_diffusers_round_trip_loads_upstream(wan_dir: Path, tmp_path: Path, tiny: Any) -> None:
    from diffusers import WanTransformer3DModel

    convert_to_dcp(wan_dir, tmp_path / "dcp")
    assert (tmp_path / "dcp" / "config.json").is_file()
    out = export_checkpoint(tmp_path / "dcp", tmp_path / "back", to="diffusers", max_shard_size="30KB")
    index = json.loads((out / "diffusion_pytorch_model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    reference, reloaded = tiny.wan().eval(), WanTransformer3DModel.from_pretrained(out).eval()
    tiny.assert_same_state(reference, reloaded)
    with torch.no_grad():
        expected, actual = reference(**tiny.wan_inputs()).sample, reloaded(**tiny.wan_inputs()).sample
    assert torch.equal(expected, actual)


def test_hf_round_trip_through_dcp_loads_upstream(umt5_dir: Path, tmp_path: Path, tiny: Any) -> None:
    from transformers import UMT5EncoderModel

    convert_to_dcp(umt5_dir, tmp_path / "dcp")
    out = export_checkpoint(tmp_path / "dcp", tmp_path / "back", to="hf")
    reloaded = UMT5EncoderModel.from_pretrained(out).eval()
    ids = torch.tensor([[1, 5, 9, 3]])
    with torch.no_grad():
        assert torch.equal(
            tiny.umt5()(input_ids=ids).last_hidden_state, reloaded(input_ids=ids).last_hidden_state
        )


def test_rename_table_applied_on_convert_and_inverted_on_export(
    vae_dir: Path, tmp_path: Path, tiny: Any
) -> None:
    from diffusers import AutoencoderKLWan

    table = KeyMapTransform(
        [RenameRule(r"^encoder\.", "enc."), RenameRule(r"^decoder\.(.*)\.weight$", r"dec.\1.w")]
    )
    register_weight_transform("toy_vae", table)
    try:
        convert_to_dcp(vae_dir, tmp_path / "dcp", model_type="toy_vae")
        keys = set(load_checkpoint_keys(tmp_path / "dcp"))
        assert any(k.startswith("enc.") for k in keys) and not any(k.startswith("encoder.") for k in keys)
        assert any(k.startswith("dec.") and k.endswith(".w") for k in keys)
        out = export_checkpoint(tmp_path / "dcp", tmp_path / "back", to="diffusers", model_type="toy_vae")
        tiny.assert_same_state(tiny.vae(), AutoencoderKLWan.from_pretrained(out))
    finally:
        KEY_MAP_REGISTRY.pop("toy_vae")


def load_checkpoint_keys(path: Path) -> list[str]:
    from mm_checkpoint.dcp_io import DcpReader
    from mm_checkpoint.layout import resolve_dcp_dir

    return DcpReader(resolve_dcp_dir(path)[0]).keys()


def test_export_casts_dtype_and_takes_config_from(umt5_dir: Path, tmp_path: Path) -> None:
    from safetensors import safe_open

    convert_to_dcp(umt5_dir, tmp_path / "dcp")
    (tmp_path / "dcp" / "config.json").unlink()
    out = export_checkpoint(
        tmp_path / "dcp", tmp_path / "bf16", to="hf", config_from=umt5_dir, dtype=torch.bfloat16
    )
    assert (out / "config.json").is_file()
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert f.get_tensor("shared.weight").dtype == torch.bfloat16
