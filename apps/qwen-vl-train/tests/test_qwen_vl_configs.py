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
    from mm_trainer.dry_run import dry_run

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
