"""The key maps of the supported models ship with mm-checkpoint as data: `wan2_2` works with no app."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mm_checkpoint import (
    KeyMapError,
    builtin_model_types,
    export_checkpoint,
    get_weight_transform,
    known_model_types,
    template_rule,
)
from mm_checkpoint.dcp_io import DcpReader
from safetensors.torch import load_file


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.view(torch.uint8).equal(b.view(torch.uint8))


def _tensors(folder: Path) -> dict:
    out = {}
    for file in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(file)))
    return out


@pytest.mark.parametrize(
    ("diffusers_key", "native_key"),
    [
        ("condition_embedder.text_embedder.linear_1.weight", "text_embedding.0.weight"),
        ("condition_embedder.time_proj.bias", "time_projection.1.bias"),
        ("blocks.0.attn1.to_out.0.weight", "blocks.0.self_attn.o.weight"),
        ("blocks.1.attn2.norm_k.weight", "blocks.1.cross_attn.norm_k.weight"),
        ("blocks.1.norm2.weight", "blocks.1.norm3.weight"),
        ("blocks.17.ffn.net.0.proj.bias", "blocks.17.ffn.0.bias"),
        ("blocks.1.scale_shift_table", "blocks.1.modulation"),
        ("scale_shift_table", "head.modulation"),
        ("proj_out.weight", "head.head.weight"),
    ],
)
def test_wan2_2_map_renames_diffusers_keys_to_native_and_back(diffusers_key: str, native_key: str) -> None:
    wan = get_weight_transform("wan2_2")
    assert wan.forward(diffusers_key) == native_key
    assert wan.inverse(native_key) == diffusers_key


@pytest.mark.parametrize(
    "native_key", ["blocks.1.norm3.weight", "head.modulation", "blocks.0.self_attn.q.weight"]
)
def test_wan2_2_map_passes_native_keys_through(native_key: str) -> None:
    assert get_weight_transform("wan2_2").forward(native_key) == native_key


def test_template_rule_matches_whole_keys_only() -> None:
    rule = template_rule("blocks.{i}.attn1.to_q.{param}", "blocks.{i}.self_attn.q.{param}")
    assert rule.forward_key("blocks.3.attn1.to_q.bias") == "blocks.3.self_attn.q.bias"
    assert rule.forward_key("model.blocks.3.attn1.to_q.bias") is None
    assert rule.forward_key("blocks.3.attn1.to_q.weight_scale") is None
    assert rule.inverse_key("blocks.3.self_attn.q.weight") == "blocks.3.attn1.to_q.weight"


def test_template_rule_refuses_placeholders_missing_on_one_side() -> None:
    with pytest.raises(KeyMapError, match="same placeholders"):
        template_rule("blocks.{i}.norm.{param}", "norm.{param}")


def test_shipped_tables_are_listed_among_the_known_model_types() -> None:
    assert "wan2_2" in builtin_model_types()
    assert set(builtin_model_types()) <= set(known_model_types())


def test_unknown_model_type_lists_the_known_ones() -> None:
    with pytest.raises(KeyMapError, match=re.escape("known model types: [") + ".*'wan2_2'"):
        get_weight_transform("wan9_9")


def test_wan2_2_table_is_data_with_one_rule_per_line() -> None:
    import mm_checkpoint

    table = Path(mm_checkpoint.__file__).parent / "key_map_tables" / "wan2_2.json"
    rules = json.loads(table.read_text())["rules"]
    assert len(rules) == len(get_weight_transform("wan2_2").rules)


def test_mm_ckpt_converts_diffusers_wan_to_native_dcp_and_back_bit_exact(
    wan_dir: Path, tmp_path: Path
) -> None:
    # a fresh interpreter: nothing but mm-checkpoint is imported before the conversion
    cli = "import sys; from mm_checkpoint.cli import main; sys.exit(main(sys.argv[1:]))"
    to_dcp = ["convert", str(wan_dir), str(tmp_path / "dcp"), "--to", "dcp", "--model-type", "wan2_2"]
    subprocess.run([sys.executable, "-c", cli, *to_dcp], check=True, capture_output=True, timeout=300)
    native = DcpReader(tmp_path / "dcp" / "iter_0000000").keys()
    assert "blocks.0.self_attn.q.weight" in native and "head.modulation" in native
    assert not [k for k in native if "attn1" in k or "condition_embedder" in k]
    export_checkpoint(tmp_path / "dcp", tmp_path / "back", to="diffusers", model_type="wan2_2")
    source, back = _tensors(wan_dir), _tensors(tmp_path / "back")
    assert source.keys() == back.keys()
    assert all(_same_bits(source[k], back[k]) for k in source)
