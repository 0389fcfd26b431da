"""The shipped configs validate, and the real-shape ones dry-run on meta without weights."""

from __future__ import annotations

from pathlib import Path

import pytest

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.mark.parametrize(
    ("name", "world"),
    [("tiny_t2av", 2), ("tiny_t2av_lora", 2), ("t2av", 8), ("t2v", 8), ("t2av_23", 8), ("t2av_25", 8)],
)
def test_config_validates(name, world):
    from mm_config import load_config

    config = load_config(CONFIGS / f"{name}.yaml", world_size=world)
    assert config.model.model_id == "ltx2_predictor"
    assert config.data.dataset_id == "ltx2_precomputed"


@pytest.mark.parametrize("name", ["t2av", "t2v"])
def test_real_shape_dry_run_builds_on_meta_without_weights(name):
    from mm_config import load_config
    from mm_trainer.planner.dry_run import build_meta_model, dry_run

    config = load_config(CONFIGS / f"{name}.yaml", world_size=8)
    assert not Path(config.model.from_pretrained).exists()
    model = build_meta_model(config).model
    assert len(model.transformer_blocks) == 48 and model.config.caption_channels == 3840
    assert model.transformer_blocks[0].attn1.heads == 32 and model.config.attention_head_dim == 128
    assert model.config.in_channels == 128
    assert 18e9 < sum(p.numel() for p in model.parameters()) < 20e9  # LTX-2: 19B
    report = dry_run(config, world_size=8)
    assert "model.transformer_blocks.47" in report and "unmatched patterns: none" in report


@pytest.mark.parametrize(("name", "release"), [("t2av_23", "2.3"), ("t2av_25", "2.5")])
def test_the_real_shape_23_and_25_configs_are_their_releases_transformer(name, release):
    """The release their options say (``ltx2_train.version``), and the text widths of the per-modality
    connectors (video 4096, audio 2048); the 48 blocks of 32 heads x 128 are the dry run's and the plan's."""
    from ltx2_train.release_inputs import text_widths
    from ltx2_train.version import config_version
    from mm_config import load_config

    shape = dict(load_config(CONFIGS / f"{name}.yaml", world_size=8).model.config)
    assert config_version(shape, name) == release
    assert text_widths(shape) == (4096, 2048)
    assert (shape["num_layers"], shape["num_attention_heads"], shape["attention_head_dim"]) == (48, 32, 128)


def test_ulysses_size_that_does_not_divide_the_heads_is_a_config_error():
    from mm_config import ConfigError, load_config

    with pytest.raises(ConfigError, match="num_attention_heads"):
        load_config(CONFIGS / "t2av.yaml", ["parallel.ulysses_parallel_size=3"], world_size=6)


def test_the_learning_recipe_validates_on_the_tiny_config_and_is_the_readmes_command():
    from ltx2_train.tiny import LEARN_TRAINING
    from mm_config import load_config

    config = load_config(
        CONFIGS / "tiny_t2av.yaml", [*LEARN_TRAINING, "parallel.ulysses_parallel_size=1"], world_size=1
    )
    assert (config.training.micro_batch_size, config.data.drop_last, config.training.train_iters) == (
        16,
        False,
        200,
    )
    readme = " ".join((CONFIGS.parent / "README.md").read_text().replace("\\\n", " ").split())
    assert " ".join(LEARN_TRAINING) in readme


def test_the_real_shape_distillation_dry_runs_its_three_transformers_on_meta():
    from mm_config import load_config
    from mm_trainer.planner.dry_run import dry_run

    config = load_config(CONFIGS / "t2av_distill.yaml", world_size=16)
    assert config.model.container_id == "ltx2_container" and config.model.pipeline["distill"]["shift"] == 16.0
    assert {name: args.freeze for name, args in config.model.sub_models().items()} == {
        "teacher": True, "model": False, "critic": False,
    }  # fmt: skip
    report = dry_run(config, world_size=16)
    for name in ("teacher", "model", "critic"):
        assert f"{name}.transformer_blocks.47" in report
    assert "unmatched patterns: none" in report
