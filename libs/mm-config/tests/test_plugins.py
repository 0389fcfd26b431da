"""Plugin sub-schemas validate a model's ``config`` and a dataset's kwargs in the same pass."""

from __future__ import annotations

import sys
import textwrap

import pytest
from mm_config import (
    ConfigModel,
    model_schema,
    register_dataset_schema,
    register_model_schema,
    unregister_schema,
)


class TinyDiTConfig(ConfigModel):
    """Keys of a toy predictor."""

    num_layers: int = 2
    """Blocks."""
    num_heads: int = 4
    """Attention heads."""
    patch_size: list[int] = [1, 2, 2]
    """Patch (t, h, w)."""


class ClipsConfig(ConfigModel):
    """Keys of a toy dataset."""

    num_frames: int = 17
    """Frames per clip."""


@pytest.fixture
def schemas():
    register_model_schema("tiny_dit", TinyDiTConfig)
    register_dataset_schema("clips", ClipsConfig)
    yield
    unregister_schema("model", "tiny_dit")
    unregister_schema("dataset", "clips")


def predictor(config):
    return {"model": {"models": {"predictor": {"model_id": "tiny_dit", "config": config}}}}


def test_registered_schema_fills_defaults_and_keeps_config_a_dict(schemas, load):
    cfg = load(predictor({"num_layers": 3}))
    assert cfg.model.models["predictor"].config == {"num_layers": 3, "num_heads": 4, "patch_size": [1, 2, 2]}


def test_plugin_errors_have_full_paths_and_suggestions(schemas, load_error, problem_at):
    err = load_error(predictor({"num_layers": "two", "num_head": 4}))
    assert "expected a valid integer" in problem_at(err, "model.models.predictor.config.num_layers")
    assert "did you mean `num_heads`?" in problem_at(err, "model.models.predictor.config.num_head")


def test_plugin_errors_come_with_framework_errors_in_one_report(schemas, load_error):
    data = predictor({"num_layers": "two"})
    data["training"] = {"seed": "s"}
    data["data"] = {"dataset_id": "clips", "dataset": {"num_frame": 3}}
    err = load_error(data)
    assert sorted(err.paths) == [
        "data.dataset.num_frame",
        "model.models.predictor.config.num_layers",
        "training.seed",
    ]


def test_single_form_config_is_validated_too(schemas, load_error, problem_at):
    err = load_error({"model": {"model_id": "tiny_dit", "config": {"patch_size": "x"}}})
    assert "expected a valid list" in problem_at(err, "model.config.patch_size")


def test_plugin_schema_heads_feed_the_ulysses_rule(schemas, load_error, problem_at):
    err = load_error(
        {"model": {"model_id": "tiny_dit"}, "parallel": {"ulysses_parallel_size": 8}}, world_size=8
    )
    assert "must be divisible by parallel.ulysses_parallel_size (8)" in problem_at(
        err, "model.config.num_heads"
    )


def test_unregistered_model_id_keeps_a_free_dict(load):
    cfg = load(predictor({"anything": [1, 2], "nested": {"k": "v"}}))
    assert cfg.model.models["predictor"].config == {"anything": [1, 2], "nested": {"k": "v"}}


def test_plugin_module_named_in_training_plugin_registers_before_validation(
    load_error, problem_at, tmp_path, monkeypatch
):
    (tmp_path / "toy_mmcfg_plugin.py").write_text(
        textwrap.dedent('''
        from mm_config import ConfigModel, register_model_schema

        class ToyConfig(ConfigModel):
            depth: int = 1
            """Depth."""

        register_model_schema("toy_from_plugin", ToyConfig)
    ''')
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        err = load_error(
            {
                "training": {"plugin": ["toy_mmcfg_plugin"]},
                "model": {"model_id": "toy_from_plugin", "config": {"depht": 2}},
            }
        )
        assert "did you mean `depth`?" in problem_at(err, "model.config.depht")
    finally:
        unregister_schema("model", "toy_from_plugin")
        sys.modules.pop("toy_mmcfg_plugin", None)


def test_conflicting_registration_is_refused(schemas):
    class Other(ConfigModel):
        pass

    with pytest.raises(ValueError, match="already has schema"):
        register_model_schema("tiny_dit", Other)
    register_model_schema("tiny_dit", TinyDiTConfig)  # same class again: fine
    assert model_schema("tiny_dit") is TinyDiTConfig


def test_schema_must_be_a_pydantic_model():
    with pytest.raises(TypeError, match="pydantic BaseModel subclass"):
        register_model_schema("bad", dict)
