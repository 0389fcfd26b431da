"""One bad config per rule: the report names the YAML path, the bad value and what was expected."""

from __future__ import annotations

import pytest

# --- parallel ---------------------------------------------------------------------------------


def test_tensor_parallel_must_be_1(load_error, problem_at):
    err = load_error({"parallel": {"tensor_parallel_size": 2}})
    assert problem_at(err, "parallel.tensor_parallel_size") == (
        "parallel.tensor_parallel_size = 2: expected 1 (tensor parallelism is not supported)"
    )


def test_ulysses_times_ring_must_divide_world_size_with_the_arithmetic_spelled_out(load_error, problem_at):
    err = load_error({"parallel": {"ulysses_parallel_size": 4, "ring_attention_size": 2}}, world_size=12)
    assert (
        "ulysses_parallel_size (4) x ring_attention_size (2) = 8 must divide the world size 12 (12 % 8 = 4)"
        in problem_at(err, "parallel.ulysses_parallel_size")
    )


def test_ring_alone_not_dividing_world_size_is_reported_at_ring_attention_size(load_error, problem_at):
    err = load_error({"parallel": {"ring_attention_size": 3}}, world_size=8)
    assert "= 3 must divide the world size 8 (8 % 3 = 2)" in problem_at(err, "parallel.ring_attention_size")


def test_an_attention_backend_without_ring_attention_is_refused(load_error, problem_at):
    err = load_error({"parallel": {"ulysses_parallel_size": 2, "attention_backend": "flash"}}, world_size=2)
    msg = problem_at(err, "parallel.attention_backend")
    assert "parallel.attention_backend = 'flash'" in msg and "ring_attention_size is 1" in msg
    assert "expected auto" in msg


def test_an_unknown_attention_backend_lists_the_kernels(load_error, problem_at):
    err = load_error({"parallel": {"ring_attention_size": 2, "attention_backend": "xformers"}}, world_size=2)
    assert "'flash_attn'" in problem_at(err, "parallel.attention_backend")


def test_replicate_parallel_size_must_divide_world_size(load_error, problem_at):
    err = load_error({"parallel": {"replicate_parallel_size": 3}}, world_size=8)
    assert "must divide the world size 8 (8 % 3 = 2)" in problem_at(err, "parallel.replicate_parallel_size")


def test_explicit_shard_degree_times_replicas_must_equal_world_size(load_error, problem_at):
    err = load_error(
        {"parallel": {"fully_shard_parallel_size": 2, "replicate_parallel_size": 2}}, world_size=8
    )
    msg = problem_at(err, "parallel.fully_shard_parallel_size")
    assert "replicate_parallel_size (2) x fully_shard_parallel_size (2) = 4, expected the world size 8" in msg
    assert "'auto' = 4" in msg


def test_shard_group_must_contain_whole_context_parallel_groups(load_error, problem_at):
    err = load_error({"parallel": {"replicate_parallel_size": 4, "ulysses_parallel_size": 4}}, world_size=8)
    assert (
        "FSDP shard group 2 (world 8 / replicate_parallel_size 4) must be a multiple of ulysses x ring = 4"
        in problem_at(err, "parallel.fully_shard_parallel_size")
    )


def test_shard_degree_must_be_auto_or_a_positive_integer(load_error, problem_at):
    err = load_error({"parallel": {"fully_shard_parallel_size": "all"}})
    assert problem_at(err, "parallel.fully_shard_parallel_size") == (
        "parallel.fully_shard_parallel_size = 'all': expected 'auto' or a positive integer"
    )


def test_dtype_must_be_a_known_name(load_error, problem_at):
    err = load_error({"parallel": {"fsdp_plan": {"param_dtype": "bf32"}}})
    assert "expected one of fp32, bf16, fp16" in problem_at(err, "parallel.fsdp_plan.param_dtype")


def test_dtype_aliases_are_normalized(load):
    cfg = load(
        {
            "parallel": {
                "fsdp_plan": {"param_dtype": "bfloat16", "reduce_dtype": "float32", "output_dtype": "float16"}
            }
        }
    )
    plan = cfg.parallel.fsdp_plan
    assert (plan.param_dtype, plan.reduce_dtype, plan.output_dtype) == ("bf16", "fp32", "fp16")


def test_module_pattern_braces_must_be_star_or_a_range(load_error):
    err = load_error({"parallel": {"fsdp_plan": {"apply_modules": ["a.{*}", "b.{0-3}", "c.{3-1}"]}}})
    assert err.paths == ["parallel.fsdp_plan.apply_modules[2]"]
    assert "bad brace group {3-1} in 'c.{3-1}'" in str(err)


def test_prefetch_counts_must_not_be_negative(load_error, problem_at):
    err = load_error({"parallel": {"fsdp_plan": {"num_to_forward_prefetch": -1}}})
    assert "expected greater than or equal to 0" in problem_at(
        err, "parallel.fsdp_plan.num_to_forward_prefetch"
    )


def test_sub_plan_must_name_a_sub_model(load_error, problem_at, container):
    err = load_error(container(parallel={"fsdp_plan": {"sub_plans": {"text_encodr": {"shard_size": 1}}}}))
    assert "did you mean `text_encoder`?" in problem_at(err, "parallel.fsdp_plan.sub_plans.text_encodr")


def test_sub_plan_shard_size_must_divide_world_size(load_error, problem_at, container):
    err = load_error(
        container(parallel={"fsdp_plan": {"sub_plans": {"text_encoder": {"shard_size": 3}}}}), world_size=8
    )
    assert "must divide the world size 8 (8 % 3 = 2)" in problem_at(
        err, "parallel.fsdp_plan.sub_plans.text_encoder.shard_size"
    )


def test_plan_pattern_must_start_with_a_sub_model_name(load_error, problem_at, container):
    err = load_error(
        container(parallel={"fsdp_plan": {"apply_modules": ["predictor.blocks.{*}", "predicter.head"]}})
    )
    msg = problem_at(err, "parallel.fsdp_plan.apply_modules[1]")
    assert "first segment `predicter` is not a sub-model" in msg and "did you mean `predictor`?" in msg


def test_recompute_pattern_must_start_with_a_sub_model_name(load_error, problem_at, container):
    err = load_error(container(features={"recompute_plan": {"apply_modules": ["dit.blocks.{*}"]}}))
    assert "expected one of: ae, predictor, text_encoder" in problem_at(
        err, "features.recompute_plan.apply_modules[0]"
    )


def test_compile_pattern_must_start_with_a_sub_model_name(load_error, problem_at, container):
    err = load_error(container(features={"compile": {"apply_modules": ["predictr.blocks.{*}"]}}))
    assert "did you mean `predictor`?" in problem_at(err, "features.compile.apply_modules[0]")


def test_recompute_policy_and_compile_mode_are_closed_sets(load_error, problem_at, container):
    err = load_error(container(features={"recompute_plan": {"policy": "some"}, "compile": {"mode": "fast"}}))
    assert "'full' or 'selective'" in problem_at(err, "features.recompute_plan.policy")
    assert "'max-autotune'" in problem_at(err, "features.compile.mode")


def test_recompute_every_is_at_least_one(load_error, problem_at, container):
    err = load_error(container(features={"recompute_plan": {"every": 0}}))
    assert "greater than or equal to 1" in problem_at(err, "features.recompute_plan.every")


def test_ulysses_must_divide_the_trainable_models_heads(load_error, problem_at, container):
    err = load_error(container(parallel={"ulysses_parallel_size": 3}), world_size=3)
    assert "must be divisible by parallel.ulysses_parallel_size (3)" in problem_at(
        err, "model.models.predictor.config.num_heads"
    )


def test_ulysses_overlap_head_groups_must_split_the_trainable_models_heads(load_error, problem_at, container):
    err = load_error(
        container(parallel={"ulysses_parallel_size": 2, "ulysses_overlap": {"head_groups": 8}}), world_size=2
    )
    msg = problem_at(err, "parallel.ulysses_overlap.head_groups")
    assert "predictor's 8 attention heads (model.models.predictor.config.num_heads)" in msg
    assert "heads must divide by head_groups x ulysses_parallel_size = 16" in msg


def test_ulysses_overlap_without_ulysses_is_refused(load_error, problem_at):
    for overlap in ({"projections": True}, {"head_groups": 2}):
        err = load_error({"parallel": {"ring_attention_size": 2, "ulysses_overlap": overlap}}, world_size=2)
        msg = problem_at(err, "parallel.ulysses_overlap")
        assert "ulysses_parallel_size is 1 (nothing to overlap); expected auto or off" in msg


def test_ulysses_overlap_takes_auto_off_or_its_two_knobs(load):
    def overlap(value):  # noqa: ANN001, ANN202
        parallel = {"ulysses_parallel_size": 2, "ulysses_overlap": value}
        return load({"parallel": parallel}, world_size=2).parallel.ulysses_overlap.model_dump()

    unset = load({"parallel": {"ulysses_parallel_size": 2}}, world_size=2).parallel.ulysses_overlap
    assert overlap("auto") == unset.model_dump() == {"projections": "auto", "head_groups": "auto"}
    assert overlap("off") == {"projections": False, "head_groups": 1}
    assert overlap({"projections": True}) == {"projections": True, "head_groups": "auto"}


def test_ulysses_overlap_projections_is_auto_or_a_bool(load_error, problem_at):
    err = load_error(
        {"parallel": {"ulysses_parallel_size": 2, "ulysses_overlap": {"projections": "yes"}}}, world_size=2
    )
    assert "expected 'auto', true or false" in problem_at(err, "parallel.ulysses_overlap.projections")


def test_ulysses_heads_rule_in_single_form_points_at_model_config(load_error, problem_at):
    err = load_error(
        {
            "model": {"model_id": "m", "config": {"num_attention_heads": 6}},
            "parallel": {"ulysses_parallel_size": 4},
        },
        world_size=4,
    )
    assert problem_at(err, "model.config.num_attention_heads").startswith(
        "model.config.num_attention_heads = 6"
    )


# --- model ------------------------------------------------------------------------------------


def test_single_model_keys_are_not_allowed_next_to_models(load_error, problem_at, container):
    data = container()
    data["model"]["from_pretrained"] = "/weights"
    err = load_error(data)
    assert "single-model key not allowed together with `models`" in problem_at(err, "model.from_pretrained")


def test_every_sub_model_needs_a_model_id(load_error, problem_at, container):
    data = container()
    del data["model"]["models"]["ae"]["model_id"]
    err = load_error(data)
    assert "expected a registered model id" in problem_at(err, "model.models.ae.model_id")


def test_sub_model_name_must_be_an_identifier(load_error, problem_at, container):
    data = container()
    data["model"]["models"]["text-encoder"] = data["model"]["models"].pop("text_encoder")
    err = load_error(data)
    assert "must be a Python identifier" in problem_at(err, "model.models.text-encoder")


def test_container_id_needs_models(load_error, problem_at):
    err = load_error({"model": {"model_id": "m", "container_id": "c"}})
    assert "a container needs sub-models" in problem_at(err, "model.container_id")


def test_model_keys_without_model_id_are_an_error(load_error, problem_at):
    err = load_error({"model": {"from_pretrained": "/weights"}})
    assert "expected a registered model id" in problem_at(err, "model.model_id")


# --- training ---------------------------------------------------------------------------------


def test_global_batch_must_equal_micro_times_accumulation_times_data_parallel(load_error, problem_at):
    err = load_error(
        {
            "parallel": {"ulysses_parallel_size": 2},
            "training": {"micro_batch_size": 2, "gradient_accumulation_steps": 3, "global_batch_size": 48},
        },
        world_size=8,
    )
    assert problem_at(err, "training.global_batch_size") == (
        "training.global_batch_size = 48: expected micro_batch_size (2) x gradient_accumulation_steps (3) x "
        "data-parallel size (4 = world 8 / ulysses x ring 2) = 24"
    )


def test_a_global_batch_that_data_parallel_micro_batches_do_not_divide_cannot_derive_accumulation(
    load_error, problem_at
):
    err = load_error({"training": {"micro_batch_size": 2, "global_batch_size": 6}}, world_size=2)
    assert problem_at(err, "training.global_batch_size") == (
        "training.global_batch_size = 6: must be a multiple of micro_batch_size (2) x data-parallel size "
        "(2 = world 2 / ulysses x ring 1) = 4 to derive gradient_accumulation_steps"
    )


def test_resetting_the_data_position_is_valid_without_load_for_a_run_that_resumes_in_place(load):
    # whether there is a checkpoint to resume (in training.save) is known only at start: the trainer refuses
    # it there when there is none (libs/mm-trainer/tests/test_resume_settings.py)
    assert load({"training": {"reset_data_position": True, "save": "runs/x"}}).training.reset_data_position


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan"])
@pytest.mark.parametrize("key", ["training.lr", "training.weight_decay", "training.ema.decay"])
def test_an_infinite_or_nan_number_is_refused(key, value, load_error, problem_at):
    section, *rest = key.split(".")
    text = f"{section}:\n  " + (
        f"{rest[0]}:\n    {rest[1]}: {value}\n" if len(rest) == 2 else f"{rest[0]}: {value}\n"
    )
    assert "expected a finite number" in problem_at(load_error(text), key)


def test_a_frozen_sub_model_cannot_be_trainable(load_error, problem_at, container):
    err = load_error(container(training={"trainable_submodels": ["predictor", "ae"]}))
    assert "sub-model `ae` is frozen (model.models.ae.freeze: true) and cannot be trained" in problem_at(
        err, "training.trainable_submodels[1]"
    )


def test_trainable_sub_model_must_exist(load_error, problem_at, container):
    err = load_error(container(training={"trainable_submodels": ["predicto"]}))
    assert "did you mean `predictor`?" in problem_at(err, "training.trainable_submodels[0]")


def test_trainable_defaults_to_the_unfrozen_sub_models(load, container):
    assert load(container()).training.trainable_submodels == ["predictor"]


def test_min_lr_must_not_exceed_lr(load_error, problem_at):
    err = load_error({"training": {"lr": 1e-5, "min_lr": 1e-4}})
    assert "must not exceed training.lr (1e-05)" in problem_at(err, "training.min_lr")


def test_warmup_must_not_exceed_train_iters(load_error, problem_at):
    err = load_error({"training": {"train_iters": 10, "lr_warmup_iters": 20}})
    assert "must not exceed training.train_iters (10)" in problem_at(err, "training.lr_warmup_iters")


def test_scheduler_must_be_a_known_name(load_error, problem_at):
    err = load_error({"training": {"lr_scheduler": "step"}})
    assert "expected 'constant', 'linear' or 'cosine'" in problem_at(err, "training.lr_scheduler")


def test_nonfinite_action_must_be_skip_or_stop(load_error, problem_at):
    err = load_error({"training": {"nonfinite": {"action": "ignore"}}})
    assert "expected 'skip' or 'stop'" in problem_at(err, "training.nonfinite.action")


def test_device_must_be_cpu_cuda_or_npu(load_error, problem_at):
    err = load_error({"training": {"device": "tpu"}})
    assert "training.device = 'tpu'" in problem_at(err, "training.device")


def test_plugin_that_cannot_be_imported_is_reported(load_error, problem_at):
    err = load_error({"training": {"plugin": ["json", "no_such_plugin_mod"]}})
    assert "cannot import plugin module: No module named 'no_such_plugin_mod'" in problem_at(
        err, "training.plugin[1]"
    )


# --- data, tools, features --------------------------------------------------------------------


def test_prefetch_factor_needs_workers(load_error, problem_at):
    err = load_error({"data": {"prefetch_factor": 2}})
    assert "needs data.num_workers > 0" in problem_at(err, "data.prefetch_factor")


def test_persistent_workers_need_workers(load_error, problem_at):
    err = load_error({"data": {"persistent_workers": True}})
    assert "needs data.num_workers > 0" in problem_at(err, "data.persistent_workers")


def test_profile_range_must_be_ordered(load_error, problem_at):
    err = load_error({"tools": {"profile": {"enable": True, "start_step": 5, "end_step": 5}}})
    assert "must be greater than start_step (5)" in problem_at(err, "tools.profile.end_step")


def test_memory_profile_range_must_be_ordered(load_error, problem_at):
    err = load_error({"tools": {"memory_profile": {"enable": True, "start_step": 3, "end_step": 1}}})
    assert "must be greater than start_step (3)" in problem_at(err, "tools.memory_profile.end_step")


def test_cross_submodel_prefetch_names_must_be_sub_models(load_error, problem_at):
    err = load_error({"parallel": {"fsdp_plan": {"cross_submodel_prefetch": ["text_encodr", "model"]}}})
    assert "not a sub-model" in problem_at(err, "parallel.fsdp_plan.cross_submodel_prefetch[0]")


def test_cross_submodel_prefetch_must_not_repeat_a_sub_model(load_error, problem_at):
    err = load_error({"parallel": {"fsdp_plan": {"cross_submodel_prefetch": ["model", "model"]}}})
    assert "names a sub-model twice" in problem_at(err, "parallel.fsdp_plan.cross_submodel_prefetch")


def test_condition_micro_steps_must_be_positive(load_error, problem_at):
    err = load_error({"features": {"condition_micro_steps": 0}})
    assert "expected greater than or equal to 1" in problem_at(err, "features.condition_micro_steps")


def test_condition_micro_steps_must_be_a_multiple_of_the_context_parallel_size(load_error, problem_at):
    err = load_error(
        {
            "parallel": {"ulysses_parallel_size": 2, "ring_attention_size": 2},
            "features": {"condition_micro_steps": 6},
        },
        world_size=4,
    )
    assert "must be a multiple of ulysses x ring = 4" in problem_at(err, "features.condition_micro_steps")


def test_condition_micro_steps_equal_to_the_context_parallel_size_is_accepted(load):
    cfg = load(
        {"parallel": {"ulysses_parallel_size": 2}, "features": {"condition_micro_steps": 2}}, world_size=2
    )
    assert cfg.features.condition_micro_steps == 2


def test_condition_micro_steps_1_means_off_and_fits_any_context_parallel_size(load):
    cfg = load({"parallel": {"ulysses_parallel_size": 2}}, world_size=2)
    assert cfg.features.condition_micro_steps == 1


# --- file level -------------------------------------------------------------------------------


def test_unknown_section_suggests_the_closest(load_error, problem_at):
    err = load_error({"trainig": {}})
    assert problem_at(err, "trainig") == "trainig: unknown key; did you mean `training`?"


def test_unknown_nested_key_suggests_the_closest(load_error, problem_at):
    err = load_error({"parallel": {"ulysses_parallel_sise": 2}})
    assert "did you mean `ulysses_parallel_size`?" in problem_at(err, "parallel.ulysses_parallel_sise")


def test_unknown_key_without_close_match_lists_valid_keys(load_error, problem_at):
    err = load_error({"features": {"zzz": 1}})
    assert (
        "expected one of: activation_offload_plan, compile, condition_micro_steps, recompute_plan"
        in problem_at(err, "features.zzz")
    )


def test_duplicate_yaml_key_is_an_error(load_error):
    err = load_error("training:\n  lr: 1.0e-5\n  lr: 1.0e-4\n")
    assert "duplicate key 'lr'" in str(err) and "line 3" in str(err)


def test_yaml_syntax_error_names_the_file(load_error):
    err = load_error("training: [\n")
    assert "config.yaml" in str(err) and "invalid YAML" in str(err)


def test_top_level_must_be_a_mapping(load_error):
    err = load_error("- a\n- b\n")
    assert "expected a mapping of sections at the top level" in str(err)


def test_missing_file_is_a_config_error(tmp_path):
    import pytest
    from mm_config import ConfigError, load_config

    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "nope.yaml")


def test_packing_needs_a_positive_token_budget(load_error, problem_at):
    err = load_error({"data": {"packing": {"token_budget": 0}}})
    assert "expected greater than or equal to 1" in problem_at(err, "data.packing.token_budget")


def test_packing_refuses_conditions_encoded_ahead(load_error, problem_at):
    err = load_error({"data": {"packing": {"token_budget": 4096}}, "features": {"condition_micro_steps": 2}})
    assert "must be 1 with data.packing" in problem_at(err, "features.condition_micro_steps")


def test_packing_refuses_training_phases_saying_why(load_error, problem_at):
    err = load_error(
        {
            "data": {"packing": {"token_budget": 4096}},
            "training": {
                "phases": {"critic": {"submodels": ["critic"]}, "generator": {"submodels": ["model"]}}
            },
        }
    )
    assert "no per-sample packed path" in problem_at(err, "training.phases")


def test_packing_with_compiled_blocks_is_accepted(load):
    config = load(
        {"data": {"packing": {"token_budget": 4096}}, "features": {"compile": {"apply_modules": ["model"]}}}
    )
    assert config.features.compile.apply_modules == ["model"]


def test_packing_with_a_token_budget_is_accepted(load):
    assert load({"data": {"packing": {"token_budget": 4096}}}).data.packing.token_budget == 4096
