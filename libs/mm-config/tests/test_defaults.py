"""Every section validates from nothing and has the documented defaults; every field is documented."""

from __future__ import annotations

import mm_config
from mm_config import (
    DataConfig,
    FeaturesConfig,
    FSDPPlanConfig,
    ModelConfig,
    ParallelConfig,
    ToolsConfig,
    TrainConfig,
    TrainingConfig,
)
from pydantic import BaseModel


def test_empty_mapping_gives_all_defaults_resolved_for_world_1():
    cfg = mm_config.validate_config({}, world_size=1)
    assert cfg.model_dump() == TrainConfig.model_validate({}, context={"world_size": 1}).model_dump()
    assert cfg.parallel.fully_shard_parallel_size == 1
    assert cfg.training.global_batch_size == 1 and cfg.training.gradient_accumulation_steps == 1
    assert cfg.training.trainable_submodels == []


def test_parallel_defaults():
    p = ParallelConfig()
    assert (p.fully_shard_parallel_size, p.replicate_parallel_size, p.tensor_parallel_size) == (
        "auto",
        "auto",
        1,
    )
    assert (p.ulysses_parallel_size, p.ring_attention_size, p.cp_size) == (1, 1, 1)
    assert p.fsdp_plan == FSDPPlanConfig()


def test_fsdp_plan_defaults():
    f = FSDPPlanConfig()
    assert f.apply_modules == [] and f.ignored_modules == [] and f.sub_plans == {}
    assert (f.param_dtype, f.reduce_dtype, f.output_dtype) == (None, None, None)
    assert f.cast_forward_inputs and f.reshard_after_forward and not f.cpu_offload
    assert (f.num_to_forward_prefetch, f.num_to_backward_prefetch) == (0, 0)


def test_model_defaults_are_an_empty_single_form():
    m = ModelConfig()
    assert m.model_id is None and m.models == {} and m.container_id is None and m.pipeline == {}
    assert (m.load_format, m.meta_init, m.freeze, m.dtype, m.config) == ("auto", False, False, None, {})
    assert m.sub_models() == {} and m.trainable_submodels() == []


def test_data_defaults():
    d = DataConfig()
    assert (d.dataset_id, d.data_path, d.data_root, d.dataset) == (None, None, None, {})
    assert (d.num_workers, d.pin_memory, d.prefetch_factor, d.persistent_workers) == (0, False, None, False)
    assert d.drop_last and d.shuffle


def test_training_defaults():
    t = TrainingConfig()
    assert (t.plugin, t.seed, t.micro_batch_size) == ([], 1234, 1)
    assert (
        t.gradient_accumulation_steps is None
        and t.global_batch_size is None
        and t.trainable_submodels is None
    )
    assert not t.reset_data_position and not t.log_sample_ids
    assert (t.lr_scheduler, t.optimizer, t.clip_grad, t.log_interval) == ("constant", "adamw", 1.0, 1)
    assert (t.load, t.save, t.log_dir, t.keep_last, t.device) == (None, None, None, None, None)
    assert (t.nonfinite.action, t.nonfinite.max_consecutive) == ("skip", 5)
    assert t.tensorboard is None and not t.deterministic  # None: on when tensorboard is installed


def test_tools_defaults_are_disabled():
    t = ToolsConfig()
    assert not t.profile.enable and not t.memory_profile.enable
    assert (
        t.profile.start_step < t.profile.end_step and t.memory_profile.start_step < t.memory_profile.end_step
    )
    assert t.profile.output_dir is None and not t.profile.record_shapes and not t.profile.with_stack


def test_features_defaults():
    f = FeaturesConfig()
    assert f.recompute_plan.apply_modules == [] and f.activation_offload_plan.apply_modules == []
    assert f.condition_micro_steps == 1
    assert (f.recompute_plan.policy, f.recompute_plan.every) == ("full", 1)
    assert f.compile.apply_modules == [] and (f.compile.backend, f.compile.mode) == ("inductor", "default")


def _models(cls: type[BaseModel], seen: set[type[BaseModel]]) -> None:
    seen.add(cls)
    for field in cls.model_fields.values():
        for sub in _model_types(field.annotation):
            if sub not in seen:
                _models(sub, seen)


def _model_types(tp) -> list[type[BaseModel]]:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    return [m for arg in getattr(tp, "__args__", ()) for m in _model_types(arg)]


def test_every_field_of_every_section_has_a_docstring_and_forbids_extra_keys():
    seen: set[type[BaseModel]] = set()
    for root in (TrainConfig, mm_config.VideoTextDatasetConfig, mm_config.PrecomputedLatentsConfig):
        _models(root, seen)
    assert {ParallelConfig, ModelConfig, DataConfig, TrainingConfig, ToolsConfig, FeaturesConfig} <= seen
    undocumented = [f"{c.__name__}.{n}" for c in seen for n, f in c.model_fields.items() if not f.description]
    assert undocumented == []
    assert all(c.model_config.get("extra") == "forbid" for c in seen)


def test_default_sections_are_not_shared_between_configs():
    a = TrainConfig.model_validate({}, context={"world_size": 4})
    b = TrainConfig.model_validate({}, context={"world_size": 2})
    assert (a.parallel.fully_shard_parallel_size, b.parallel.fully_shard_parallel_size) == (4, 2)
    assert ParallelConfig().fully_shard_parallel_size == "auto"
    assert mm_config.__version__
