"""The shipped configs validate, and the 7B one explains its FSDP plan at world size 8 on meta."""

from __future__ import annotations

from pathlib import Path

import pytest

CONFIGS = Path(__file__).parents[1] / "configs"


@pytest.mark.parametrize(("name", "world"), [("tiny_sft.yaml", 2), ("qwen2_5_vl_7b_sft.yaml", 8)])
def test_config_validates(name, world):
    from mm_config import load_config

    config = load_config(CONFIGS / name, world_size=world)
    assert config.model.model_id == "qwen2_5_vl" and config.data.dataset_id == "conversation"
    assert config.data.dataset["mm_plugin"] == "qwen2_vl" and config.data.dataset["packing"] is True


def test_7b_dry_run_prints_bytes_per_rank_at_world_8():
    from mm_config import load_config
    from mm_trainer.planner.dry_run import dry_run

    table = dry_run(load_config(CONFIGS / "qwen2_5_vl_7b_sft.yaml", world_size=8), world_size=8)
    assert "model.model.visual.blocks.31" in table and "model.model.language_model.layers.27" in table
    assert "world size: 8" in table and "sharded params per rank, model: 3.9 GiB" in table
    assert "unmatched patterns: none" in table


def test_a_freeze_group_typo_is_a_config_error():
    from mm_config import ConfigError, load_config

    with pytest.raises(
        ConfigError, match="model.config.freeze_group: unknown key; did you mean `freeze_groups`"
    ):
        load_config(CONFIGS / "tiny_sft.yaml", ["model.config.freeze_group=[vision_tower]"], world_size=2)


def test_every_listed_typo_of_the_qwen_vl_config_is_one_error_of_one_check_before_any_weight_is_read(
    tiny_root, tmp_path
):
    import shutil

    from mm_config import ConfigError, check_config

    model = shutil.copytree(tiny_root / "model", tmp_path / "model")
    for weights in model.glob("*.safetensors"):
        weights.write_bytes(b"junk: a check that read the weights would fail on it")
    typos = {
        "data.dataset.processor": f"{tmp_path / 'nowhere'}",
        "data.dataset.mm_plugin": "qwen2vl",
        "data.dataset.template": "chatmlx",
        "model.config.attn_implementation": "sdpaa",
        "model.config.freeze_groups": "[vision_towr]",
        "model.config.hf_config": "{text_config: {rms_norm_epss: 1.0e-6}}",
        "parallel.fsdp_plan.apply_modules": '["model.model.visual.blocks.{*}", "model.model.language_model.layer.{*}"]',
    }
    paths = [f"model.from_pretrained={model}", f"data.data_path={tiny_root / 'data' / 'sharegpt.json'}"]
    with pytest.raises(ConfigError) as info:
        check_config(
            CONFIGS / "tiny_sft.yaml", [*paths, *(f"{k}={v}" for k, v in typos.items())], world_size=2
        )
    found = info.value.paths
    expected = {
        "data.dataset.processor": "path not found",
        "data.dataset.mm_plugin": "did you mean `qwen2_vl`?",
        "data.dataset.template": "did you mean `chatml`?",
        "model.config.attn_implementation": "did you mean `sdpa`?",
        "model.config.freeze_groups[0]": "did you mean `vision_tower`?",
        "model.config.hf_config.text_config.rms_norm_epss": "did you mean `rms_norm_eps`?",
        "parallel.fsdp_plan.apply_modules[1]": "segment `layer` matches no module",
    }
    assert sorted(found) == sorted(expected), str(info.value)
    for problem in info.value.problems:
        assert expected[problem.path] in problem.message, problem


def test_a_misspelt_model_id_is_refused_by_the_check_and_the_trainers_preflight_naming_the_generic_id(
    tiny_root,
):
    """``qwen25_vl`` over a transformers folder used to pass with a warning and train through transformers'
    generic class (other losses at 1 rank, a collective mismatch at 2): now one error at ``model.model_id``."""
    from mm_config import ConfigError, check_config, load_config
    from mm_trainer.checks.preflight import preflight

    model, data = tiny_root / "model", tiny_root / "data" / "sharegpt.json"
    overrides = [f"model.from_pretrained={model}", f"data.data_path={data}", f"data.dataset.processor={model}",
                 "model.model_id=qwen25_vl"]  # fmt: skip
    with pytest.raises(ConfigError) as checked:
        check_config(CONFIGS / "tiny_sft.yaml", overrides, world_size=2)
    with pytest.raises(ConfigError) as preflighted:
        preflight(load_config(CONFIGS / "tiny_sft.yaml", overrides, world_size=2))
    for err in (checked.value, preflighted.value):
        assert err.paths == ["model.model_id"], str(err)
        message = err.problems[0].message
        assert "did you mean `qwen2_5_vl`?" in message and "set model_id: hf_causal_lm" in message, message
