"""FSDPPlan parsing and the pure unit layout (no process group)."""

from __future__ import annotations

import pytest
import torch
from mm_parallel import FSDPPlan, PatternMatchError, SubPlan, plan_units


def test_from_dict_parses_dtype_strings_and_sub_plans() -> None:
    plan = FSDPPlan.from_dict(
        {
            "apply_modules": ["predictor.blocks.{*}"],
            "param_dtype": "bf16",
            "reduce_dtype": "float32",
            "output_dtype": None,
            "sub_plans": {
                "text_encoder": {"shard_size": 4},
                "ae": {"enabled": False},
                "predictor": {"shard_size": None},
            },
        }
    )
    assert (plan.param_dtype, plan.reduce_dtype, plan.output_dtype) == (torch.bfloat16, torch.float32, None)
    assert plan.sub_plans["text_encoder"] == SubPlan(shard_size=4)
    assert plan.sub_plans["ae"].enabled is False
    assert plan.sub_plans["predictor"].shard_size is None  # null = the global mesh
    assert plan.effective_reshard("text_encoder") is True


def test_sub_plan_overrides_reshard_and_offload() -> None:
    plan = FSDPPlan(
        cpu_offload=True, sub_plans={"te": {"reshard_after_forward": False, "cpu_offload": False}}
    )
    assert plan.effective_reshard("te") is False and plan.effective_reshard("dit") is True
    assert plan.effective_cpu_offload("te") is False and plan.effective_cpu_offload("dit") is True


@pytest.mark.parametrize(
    ("mapping", "message"),
    [
        (
            {"apply_module": ["x"]},
            r"parallel\.fsdp_plan: unknown key 'apply_module'; did you mean 'apply_modules'",
        ),
        ({"param_dtype": "bf32"}, r"parallel\.fsdp_plan\.param_dtype: 'bf32' is not a dtype"),
        ({"apply_modules": "predictor"}, r"apply_modules: expected a list"),
        ({"num_to_forward_prefetch": -1}, r"num_to_forward_prefetch: expected an integer >= 0"),
        (
            {"sub_plans": {"te": {"shard": 2}}},
            r"sub_plans\.te: unknown key 'shard'; did you mean 'shard_size'",
        ),
        ({"sub_plans": {"te": {"shard_size": 0}}}, r"sub_plans\.te\.shard_size: expected a positive integer"),
        (
            {"sub_plans": {"te": {"shard_size": -1}}},
            r"sub_plans\.te\.shard_size: expected a positive integer or null",
        ),
        ({"reshard_after_forward": 2}, r"reshard_after_forward: expected bool, got 2"),
        ({"apply_modules": ["blocks.{x}"]}, r"apply_modules\[0\]: pattern 'blocks\.\{x\}': bad brace group"),
        ({"cpu_offload": "yes"}, r"cpu_offload: expected bool"),
    ],
)
def test_bad_plan_names_the_key(mapping: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FSDPPlan.from_dict(mapping)


def test_layout_wraps_children_before_parents(toy) -> None:
    plan = FSDPPlan.from_dict(toy.plan(apply_modules=["predictor.blocks.{*}", "predictor.blocks.{*}.mlp"]))
    layout = plan_units(toy.make_container(), plan)
    assert [u.path for u in layout.units] == [
        "text_encoder",  # fallback: not matched, wrapped whole
        "predictor.blocks.0.mlp",
        "predictor.blocks.0",
        "predictor.blocks.1.mlp",
        "predictor.blocks.1",
        "predictor.blocks.2.mlp",
        "predictor.blocks.2",
        "predictor",
    ]
    assert layout.units[0].kind == "fallback"
    owned = {u.path: u.param_names for u in layout.units}
    assert owned["predictor.blocks.0.mlp"] == [
        f"predictor.blocks.0.mlp.{i}.{w}" for i in (0, 2) for w in ("weight", "bias")
    ]
    assert "predictor.blocks.0.mlp.0.weight" not in owned["predictor.blocks.0"]
    assert owned["predictor"] == [
        "predictor.in_proj.weight",
        "predictor.in_proj.bias",
        "predictor.head.weight",
        "predictor.head.bias",
    ]
    assert layout.ignored_params == ["ae.encoder.bias", "ae.encoder.weight"]


def test_plain_model_gets_a_root_unit(toy) -> None:
    predictor = toy.make_container().predictor
    layout = plan_units(predictor, FSDPPlan(apply_modules=["blocks.{*}"]))
    assert [(u.path, u.kind, u.owner) for u in layout.units][-1] == ("", "root", "")
    assert layout.units[-1].param_names == ["in_proj.weight", "in_proj.bias", "head.weight", "head.bias"]


def test_typo_in_apply_modules_names_the_closest_path(toy) -> None:
    plan = FSDPPlan.from_dict(toy.plan(apply_modules=["predictor.blocks.{*}", "predictor.haed"]))
    with pytest.raises(
        PatternMatchError, match=r"apply_modules: pattern 'predictor\.haed'.*'predictor\.head'"
    ):
        plan_units(toy.make_container(), plan)


def test_unknown_sub_plan_names_the_closest_sub_model(toy) -> None:
    plan = FSDPPlan.from_dict(toy.plan(sub_plans={"text_encodr": {"shard_size": 2}}))
    with pytest.raises(ValueError, match=r"sub_plans: 'text_encodr' is not a sub-model.*'text_encoder'"):
        plan_units(toy.make_container(), plan)


def test_module_both_applied_and_ignored_is_rejected(toy) -> None:
    plan = FSDPPlan.from_dict(toy.plan(apply_modules=["ae.encoder"], ignored_modules=["ae"]))
    with pytest.raises(
        ValueError, match=r"'ae\.encoder' is matched by apply_modules but lies inside ignored module 'ae'"
    ):
        plan_units(toy.make_container(), plan)


def test_sub_plans_need_a_container(toy) -> None:
    plan = FSDPPlan(apply_modules=["blocks.{*}"], sub_plans={"blocks": {"shard_size": 2}})
    with pytest.raises(
        ValueError, match=r"sub_plans: ToyPredictor is not a container \(_fsdp_skip_root_wrap"
    ):
        plan_units(toy.make_container().predictor, plan)
