"""LoRA adapters read from a training checkpoint and written as PEFT, ComfyUI and merged files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from mm_checkpoint import (
    KEY_MAP_REGISTRY,
    CheckpointFormatError,
    DistributedCheckpointer,
    KeyMapTransform,
    RenameRule,
    export_merged,
    read_lora_adapters,
    read_lora_file,
    read_lora_file_shapes,
    register_weight_transform,
    save_comfy_lora,
    save_peft_lora,
)
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

RANK, ALPHA = 2, 8.0  # scale 4
# Checkpoint side `blocks.<i>.attn.q.` <-> model side `blocks.<i>.q.` (as diffusers <-> native Wan).
MAP = KeyMapTransform([RenameRule(r"^blocks\.(\d+)\.attn\.q\.", r"blocks.\1.q.")])


@pytest.fixture
def key_map():
    register_weight_transform("lora_test_map", MAP)
    yield "lora_test_map"
    KEY_MAP_REGISTRY.pop("lora_test_map")


def _module(params: dict[str, torch.Tensor]) -> nn.Module:
    root = nn.Module()
    for name, value in params.items():
        *path, leaf = name.split(".")
        module = root
        for part in path:
            if not hasattr(module, part):
                module.add_module(part, nn.Module())
            module = getattr(module, part)
        module.register_parameter(leaf, nn.Parameter(value))
    return root


def _adapters(layers: int = 2) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    out = {}
    for i in range(layers):
        out[f"predictor.blocks.{i}.q.lora_A.default.weight"] = torch.randn(RANK, 6, generator=g)
        out[f"predictor.blocks.{i}.q.lora_B.default.weight"] = torch.randn(5, RANK, generator=g)
    return out


def _checkpoint(tmp_path: Path, params: dict[str, torch.Tensor]) -> Path:
    root = tmp_path / "ckpt"
    DistributedCheckpointer(root).save({"model": _module(params)}, 3)
    return root


def test_adapters_pair_lora_a_and_b_by_module_path_under_the_submodule(tmp_path):
    params = _adapters()
    adapters = read_lora_adapters(_checkpoint(tmp_path, params), alpha=ALPHA, submodule="predictor")
    assert sorted(adapters) == ["blocks.0.q", "blocks.1.q"]
    one = adapters["blocks.1.q"]
    assert torch.equal(one.down, params["predictor.blocks.1.q.lora_A.default.weight"])
    assert torch.equal(one.up, params["predictor.blocks.1.q.lora_B.default.weight"])
    assert (one.rank, one.scale) == (RANK, ALPHA / RANK)
    torch.testing.assert_close(one.delta(), 4.0 * one.up @ one.down)


def test_a_checkpoint_without_adapters_is_refused(tmp_path):
    root = _checkpoint(tmp_path, {"predictor.blocks.0.q.weight": torch.zeros(5, 6)})
    with pytest.raises(CheckpointFormatError, match="holds no LoRA adapter"):
        read_lora_adapters(root, alpha=ALPHA, submodule="predictor")


def test_an_adapter_without_its_b_half_is_refused_naming_it(tmp_path):
    params = _adapters()
    del params["predictor.blocks.1.q.lora_B.default.weight"]
    with pytest.raises(CheckpointFormatError, match=r"without both lora_A and lora_B: \['blocks.1.q'\]"):
        read_lora_adapters(_checkpoint(tmp_path, params), alpha=ALPHA, submodule="predictor")


def test_comfy_file_holds_lora_down_up_and_a_0d_alpha_under_diffusion_model(tmp_path):
    adapters = read_lora_adapters(_checkpoint(tmp_path, _adapters()), alpha=ALPHA, submodule="predictor")
    state = load_file(save_comfy_lora(adapters, tmp_path / "comfy.safetensors"))
    assert sorted(state) == [
        f"diffusion_model.blocks.{i}.q.{part}"
        for i in (0, 1)
        for part in ("alpha", "lora_down.weight", "lora_up.weight")
    ]
    assert torch.equal(state["diffusion_model.blocks.0.q.lora_down.weight"], adapters["blocks.0.q"].down)
    assert torch.equal(state["diffusion_model.blocks.0.q.lora_up.weight"], adapters["blocks.0.q"].up)
    assert (
        state["diffusion_model.blocks.0.q.alpha"].shape == ()
        and state["diffusion_model.blocks.0.q.alpha"] == ALPHA
    )


def test_alpha_folded_comfy_file_holds_lora_a_and_scaled_b_under_the_key_maps_names(tmp_path, key_map):
    adapters = read_lora_adapters(_checkpoint(tmp_path, _adapters()), alpha=ALPHA, submodule="predictor")
    path = save_comfy_lora(adapters, tmp_path / "ltx.safetensors", model_type=key_map, alpha_folded=True)
    state = load_file(path)
    names = [f"diffusion_model.blocks.{i}.attn.q.lora_{ab}.weight" for i in (0, 1) for ab in "AB"]
    assert sorted(state) == names
    one = adapters["blocks.1.q"]
    a, b = (state[f"diffusion_model.blocks.1.attn.q.lora_{ab}.weight"] for ab in "AB")
    assert torch.equal(a, one.down)
    torch.testing.assert_close(b, 4.0 * one.up)
    torch.testing.assert_close(b @ a, one.delta())  # read at scale 1, it is the trained update


def test_peft_file_renames_paths_through_the_key_map_and_records_rank_and_alpha(tmp_path, key_map):
    adapters = read_lora_adapters(_checkpoint(tmp_path, _adapters()), alpha=ALPHA, submodule="predictor")
    path = save_peft_lora(adapters, tmp_path / "peft" / "lora.safetensors", model_type=key_map)
    with safe_open(str(path), "pt") as f:
        keys, meta = sorted(f.keys()), f.metadata()
    assert keys == [f"transformer.blocks.{i}.attn.q.lora_{ab}.weight" for i in (0, 1) for ab in "AB"]
    assert json.loads(meta["lora_adapter_metadata"]) == {
        "transformer.r": RANK,
        "transformer.lora_alpha": ALPHA,
        "transformer.target_modules": ["blocks.0.attn.q", "blocks.1.attn.q"],
        "transformer.lora_dropout": 0.0,
    }


@pytest.mark.parametrize("layout", ["peft", "comfy", "folded"])
def test_a_lora_file_reads_back_as_the_adapters_it_was_written_from_under_the_models_paths(
    tmp_path, key_map, layout
):
    """... and its header alone (``read_lora_file_shapes``) names the same layers with A's and B's shapes."""
    adapters = read_lora_adapters(_checkpoint(tmp_path, _adapters()), alpha=ALPHA, submodule="predictor")
    out = tmp_path / "lora.safetensors"
    if layout == "peft":
        save_peft_lora(adapters, out, model_type=key_map)
    else:
        save_comfy_lora(adapters, out, model_type=key_map, alpha_folded=layout == "folded")
    read = read_lora_file(out, model_type=key_map)
    assert sorted(read) == sorted(adapters) == ["blocks.0.q", "blocks.1.q"]
    for path, weights in adapters.items():
        assert torch.equal(read[path].down, weights.down)
        torch.testing.assert_close(read[path].delta(), weights.delta())  # folded: alpha = rank, B scaled
    shapes = read_lora_file_shapes(out, model_type=key_map)
    assert shapes == {p: (tuple(w.down.shape), tuple(w.up.shape)) for p, w in read.items()}


def test_a_lora_file_with_a_tensor_of_no_lora_layout_is_refused_naming_it(tmp_path):
    save_file({"blocks.0.q.lora_A.weight": torch.zeros(2, 3), "blocks.0.q.weight": torch.zeros(3, 3)},
              tmp_path / "x.safetensors")  # fmt: skip
    for read in (read_lora_file, read_lora_file_shapes):
        with pytest.raises(CheckpointFormatError, match=r"'blocks.0.q.weight' is no LoRA tensor"):
            read(tmp_path / "x.safetensors")


def test_adapters_of_different_ranks_do_not_share_one_peft_file(tmp_path):
    params = _adapters()
    params["predictor.blocks.1.q.lora_A.default.weight"] = torch.zeros(3, 6)
    params["predictor.blocks.1.q.lora_B.default.weight"] = torch.zeros(5, 3)
    adapters = read_lora_adapters(_checkpoint(tmp_path, params), alpha=ALPHA, submodule="predictor")
    with pytest.raises(CheckpointFormatError, match="share rank and alpha"):
        save_peft_lora(adapters, tmp_path / "lora.safetensors")


def _base_folder(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    base = {
        f"blocks.{i}.attn.q.{p}": torch.randn(*s, generator=g)
        for i in (0, 1)
        for p, s in (("weight", (5, 6)), ("bias", (5,)))
    }
    base["head.weight"] = torch.randn(3, 5, generator=g).to(torch.bfloat16)
    folder = tmp_path / "base"
    folder.mkdir()
    save_file(base, str(folder / "model.safetensors"))
    (folder / "config.json").write_text("{}")
    return folder, base


def test_merged_export_adds_scale_b_a_to_each_adapted_weight_and_copies_the_rest(tmp_path, key_map):
    adapters = read_lora_adapters(_checkpoint(tmp_path, _adapters()), alpha=ALPHA, submodule="predictor")
    folder, base = _base_folder(tmp_path)
    out = export_merged(folder, adapters, tmp_path / "merged", to="hf", model_type=key_map)
    merged = load_file(out / "model.safetensors")
    assert sorted(merged) == sorted(base) and (out / "config.json").is_file()
    for i in (0, 1):
        a = adapters[f"blocks.{i}.q"]
        expected = base[f"blocks.{i}.attn.q.weight"] + ALPHA / RANK * a.up @ a.down
        torch.testing.assert_close(merged[f"blocks.{i}.attn.q.weight"], expected)
        assert torch.equal(merged[f"blocks.{i}.attn.q.bias"], base[f"blocks.{i}.attn.q.bias"])
    assert merged["head.weight"].dtype == torch.bfloat16 and torch.equal(
        merged["head.weight"], base["head.weight"]
    )


def test_merged_export_refuses_adapters_on_layers_the_base_lacks(tmp_path, key_map):
    params = {k.replace("blocks.1.", "blocks.7."): v for k, v in _adapters().items()}
    adapters = read_lora_adapters(_checkpoint(tmp_path, params), alpha=ALPHA, submodule="predictor")
    folder, _ = _base_folder(tmp_path)
    with pytest.raises(CheckpointFormatError, match=r"no weight for the adapted layers \['blocks.7.q'\]"):
        export_merged(folder, adapters, tmp_path / "merged", to="hf", model_type=key_map)
