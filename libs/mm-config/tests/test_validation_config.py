"""``training.validation``: what the section accepts and which combinations it refuses."""

from __future__ import annotations

import pytest
from mm_config import ConfigError, load_config


def _with_validation(container, **validation):
    return container(training={"save": "runs/x", "validation": validation})


def test_a_validation_section_loads_with_its_defaults_and_seeds_by_prompt_index(container, load):
    v = load(_with_validation(container, prompts=["a cat", "a dog"])).training.validation
    assert (v.interval, v.num_frames, v.sampling_steps, v.guidance_scale, v.data_path) == (
        500,
        81,
        20,
        1.0,
        None,
    )
    assert v.prompt_seeds() == [0, 1]


def test_validation_with_neither_prompts_nor_held_out_data_is_refused(container, load_error, problem_at):
    err = load_error(_with_validation(container, interval=10))
    assert "prompts (clips) or data_path" in problem_at(err, "training.validation.prompts")


def test_validation_seeds_must_match_the_prompts_one_to_one(container, load_error, problem_at):
    err = load_error(_with_validation(container, prompts=["a", "b"], seeds=[3]))
    assert "one seed per prompt (2), got 1" in problem_at(err, "training.validation.seeds")


def test_validation_without_save_or_log_dir_is_refused(container, load_error, problem_at):
    err = load_error(container(training={"validation": {"prompts": ["a"]}}))
    assert "training.log_dir (or save)" in problem_at(err, "training.validation")


def test_the_held_out_file_must_exist_when_paths_are_checked(container, write_config, tmp_path):
    data = _with_validation(container, data_path=str(tmp_path / "missing.json"))
    with pytest.raises(ConfigError) as info:
        load_config(write_config(data), [], world_size=1, check_paths=True)
    assert any(p.path == "training.validation.data_path" for p in info.value.problems)


def test_validating_with_the_ema_needs_an_ema_to_validate_with(container, load, load_error, problem_at):
    err = load_error(_with_validation(container, prompts=["a"], ema=True))
    assert "training.ema keeps none" in problem_at(err, "training.validation.ema")
    data = container(training={"save": "runs/x", "validation": {"prompts": ["a"], "ema": True}, "ema": {}})
    assert load(data).training.validation.ema is True
