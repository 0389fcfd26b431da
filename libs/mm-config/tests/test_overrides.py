"""Dotted overrides are typed like YAML scalars and can address dict keys and list indices."""

from __future__ import annotations

import pytest
from mm_config import ConfigError, parse_override


@pytest.mark.parametrize(
    ("text", "path", "value"),
    [
        ("training.train_iters=20", ["training", "train_iters"], 20),
        ("training.lr=1e-5", ["training", "lr"], 1e-5),
        ("training.lr=3.5E+2", ["training", "lr"], 350.0),
        ("training.lr=0.5", ["training", "lr"], 0.5),
        ("training.tensorboard=true", ["training", "tensorboard"], True),
        ("training.save=null", ["training", "save"], None),
        ("training.save=/tmp/run", ["training", "save"], "/tmp/run"),
        ("training.plugin=[a, b]", ["training", "plugin"], ["a", "b"]),
        ("model.config.patch_size=[1,2,2]", ["model", "config", "patch_size"], [1, 2, 2]),
        ("parallel.fsdp_plan.apply_modules[1]=x.{*}", ["parallel", "fsdp_plan", "apply_modules", 1], "x.{*}"),
        ("a.b=k=v", ["a", "b"], "k=v"),
    ],
)
def test_parse_override_types_values_like_yaml(text, path, value):
    got_path, got_value = parse_override(text)
    assert got_path == path
    assert got_value == value and type(got_value) is type(value)


def test_int_float_bool_and_null_overrides_reach_the_config(load):
    cfg = load(
        {"training": {"save": "/runs/a"}},
        "training.train_iters=7",
        "training.lr=2e-4",
        "training.tensorboard=true",
        "training.save=null",
        "training.clip_grad=0",
    )
    t = cfg.training
    assert (t.train_iters, t.lr, t.tensorboard, t.save, t.clip_grad) == (7, 2e-4, True, None, 0.0)


def test_list_override_replaces_a_list(load):
    cfg = load({"training": {}}, "training.plugin=[os, json]")
    assert cfg.training.plugin == ["os", "json"]


def test_list_index_override_replaces_one_item(load):
    data = {"parallel": {"fsdp_plan": {"apply_modules": ["a.{*}", "b.{*}"]}}}
    cfg = load(data, "parallel.fsdp_plan.apply_modules[1]=c.{0-3}")
    assert cfg.parallel.fsdp_plan.apply_modules == ["a.{*}", "c.{0-3}"]


def test_dict_key_override_addresses_a_named_sub_model(load, container):
    cfg = load(
        container(),
        "model.models.predictor.freeze=true",
        "model.models.ae.dtype=bfloat16",
        "parallel.fsdp_plan.ignored_modules=[ae]",  # a bf16 VAE next to fp32 sub-models: outside the FSDP plan
        "training.trainable_submodels=[]",
    )
    assert cfg.model.models["predictor"].freeze is True
    assert cfg.model.models["ae"].dtype == "bf16"


def test_override_creates_missing_sections(load):
    cfg = load(
        {"training": {}},
        "tools.profile.enable=true",
        "tools.profile.start_step=1",
        "tools.profile.end_step=3",
    )
    assert cfg.tools.profile.enable and cfg.tools.profile.end_step == 3


def test_yaml_file_reads_exponent_floats_without_a_dot(load):
    cfg = load("training:\n  lr: 1e-5\n  min_lr: 1e-7\n  lr_scheduler: cosine\n")
    assert cfg.training.lr == 1e-5 and cfg.training.min_lr == 1e-7


def test_override_of_an_unknown_key_is_reported_with_a_suggestion(load_error, problem_at):
    err = load_error({"training": {}}, "training.learning_rate=1e-4")
    assert problem_at(err, "training.learning_rate").startswith("training.learning_rate: unknown key")


def test_override_without_equals_sign_is_an_error(load_error):
    err = load_error({"training": {}}, "training.lr")
    assert "expected KEY.PATH=VALUE" in str(err)


def test_override_index_out_of_range_is_an_error(load):
    with pytest.raises(ConfigError, match=r"apply_modules\[5\]: index out of range for a list of 1 items"):
        load({"parallel": {"fsdp_plan": {"apply_modules": ["a"]}}}, "parallel.fsdp_plan.apply_modules[5]=b")


def test_override_into_a_scalar_is_an_error(load):
    with pytest.raises(ConfigError, match="training.lr is 1e-05, not a mapping or list"):
        load({"training": {"lr": 1e-5}}, "training.lr.x=1")
