"""Keys that validated and then did nothing, or crashed at step 1, are refused by the check with the reason:
``min_lr`` under a constant schedule, compile / recompute options of a plan that matches no module, dtypes
that cannot run together without ``param_dtype``, a learning rate float32 cannot hold."""

from __future__ import annotations

from typing import ClassVar

import pytest
from mm_config import PartialConfigModel, register_pipeline_schema
from mm_config.registry import unregister_schema

PHASES = {"critic": {"submodels": ["critic"]}, "generator": {"submodels": ["predictor"], "every": 5}}


def phased(container, **phase_keys):
    """The container config with a trainable critic and two phases, ``phase_keys`` merged into the critic's."""
    data = container(training={"phases": {**PHASES, "critic": {**PHASES["critic"], **phase_keys}}})
    data["model"]["models"]["critic"] = {"model_id": "toy_dit", "config": {"num_heads": 8}}
    return data


def test_min_lr_with_the_constant_schedule_is_refused_as_read_by_nothing(load_error, problem_at):
    err = load_error({"training": {"lr": 1e-3, "min_lr": 1e-4, "lr_scheduler": "constant"}})
    message = problem_at(err, "training.min_lr")
    assert (
        "ends a linear / cosine decay, and training.lr_scheduler is `constant`: nothing reads it" in message
    )


def test_min_lr_is_accepted_with_a_decay_and_where_a_phase_that_reads_it_decays(load, container):
    assert load({"training": {"lr": 1e-3, "min_lr": 1e-4, "lr_scheduler": "cosine"}}).training.min_lr == 1e-4
    data = phased(container, lr_scheduler="linear")  # the critic decays to training.min_lr
    data["training"].update(lr=1e-3, min_lr=1e-4)
    assert load(data).training.min_lr == 1e-4


def test_a_phase_min_lr_is_refused_under_a_constant_schedule_and_above_the_phase_lr(
    load_error, problem_at, container
):
    err = load_error(phased(container, min_lr=1e-6))
    assert "this phase's schedule is `constant`" in problem_at(err, "training.phases.critic.min_lr")
    err = load_error(phased(container, min_lr=1e-3, lr=1e-4, lr_scheduler="cosine"))
    assert "must not exceed the phase's lr (0.0001)" in problem_at(err, "training.phases.critic.min_lr")


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [("compile", "mode", "max-autotune"), ("compile", "backend", "aot_eager"),
     ("recompute_plan", "policy", "selective"), ("recompute_plan", "every", 2)],
)  # fmt: skip
def test_an_option_of_a_feature_plan_without_modules_is_refused(load_error, problem_at, section, key, value):
    err = load_error({"features": {section: {key: value}}})
    assert "nothing: apply_modules is empty" in problem_at(err, f"features.{section}.{key}")


def test_an_option_of_a_feature_plan_with_modules_is_accepted(load, container):
    features = {"compile": {"apply_modules": ["predictor"], "mode": "max-autotune"}}
    assert load(container(features=features)).features.compile.mode == "max-autotune"


@pytest.mark.parametrize("where", ["training.lr", "training.phases.critic.lr"])
def test_a_learning_rate_float32_cannot_hold_is_refused(load_error, problem_at, container, where):
    data = phased(container)
    if where == "training.lr":
        data["training"]["lr"] = 1e39
    else:
        data["training"]["phases"]["critic"]["lr"] = 1e39
    message = problem_at(load_error(data), where)
    assert "overflows float32" in message and "cannot be converted to type float without overflow" in message


def test_output_dtype_without_param_dtype_is_refused_with_the_mismatch_it_would_cause(
    load_error, problem_at, container
):
    err = load_error(
        container(parallel={"fsdp_plan": {"apply_modules": ["predictor.blocks.{*}"], "output_dtype": "bf16"}})
    )
    message = problem_at(err, "parallel.fsdp_plan.output_dtype")
    assert (
        "casts no unit's inputs" in message and "predictor fp32" in message and "set param_dtype" in message
    )


def test_output_dtype_equal_to_the_stored_dtype_without_param_dtype_is_refused_as_casting_nothing(
    load_error, problem_at
):
    err = load_error({"parallel": {"fsdp_plan": {"apply_modules": ["model.blocks.{*}"], "output_dtype": "fp32"}},
                      "model": {"model_id": "toy_dit"}})  # fmt: skip
    assert "casting its outputs to fp32 does nothing" in problem_at(err, "parallel.fsdp_plan.output_dtype")


def test_sub_models_wrapped_in_different_dtypes_without_param_dtype_are_refused_naming_the_odd_one(
    load_error, problem_at, container
):
    data = container()
    data["model"]["models"]["text_encoder"]["dtype"] = "bf16"  # a bf16 text encoder feeding an fp32 predictor
    message = problem_at(load_error(data), "model.models.text_encoder.dtype")
    assert "`text_encoder` is stored in bf16 and the other sub-models the FSDP plan wraps in fp32" in message


def test_mixed_dtypes_are_accepted_with_param_dtype_or_outside_the_plan(load, container):
    data = container(parallel={"fsdp_plan": {"param_dtype": "bf16", "output_dtype": "fp32"}})
    data["model"]["models"]["text_encoder"]["dtype"] = "bf16"
    assert load(data).parallel.fsdp_plan.output_dtype == "fp32"
    data = container(parallel={"fsdp_plan": {"ignored_modules": ["ae"]}})
    data["model"]["models"]["ae"]["dtype"] = "bf16"  # never wrapped: FSDP would cast nothing of it either way
    assert load(data).model.models["ae"].dtype == "bf16"


def test_a_pipeline_that_casts_its_models_inputs_takes_the_mixed_dtypes_on_itself(
    load, load_error, container
):
    class CastingOptions(PartialConfigModel):
        input_cast: str | None = None
        """Dtype the pipeline casts its models' inputs to."""

        input_dtype_key: ClassVar[str] = "input_cast"

    register_pipeline_schema("toy_container", CastingOptions)
    try:
        data = container()
        data["model"]["models"]["text_encoder"]["dtype"] = "bf16"
        load_error(data)  # the option unset: nothing casts
        data["model"]["pipeline"] = {"input_cast": "fp32"}
        assert load(data).model.pipeline == {"input_cast": "fp32"}
    finally:
        unregister_schema("pipeline", "toy_container")
