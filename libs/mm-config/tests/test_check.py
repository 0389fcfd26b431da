"""The check before a run: strict types, bounds, an empty file, the paths the run reads, plugin
pipeline and built-in dataset schemas, and the warnings a valid config may still deserve."""

from __future__ import annotations

import subprocess
import sys

import pytest
from mm_config import (
    ConfigModel,
    PartialConfigModel,
    check_config,
    config_warnings,
    declare_ids,
    recheck_config,
    register_model_schema,
    register_pipeline_schema,
    undeclare_ids,
    unregister_schema,
)
from pydantic import Field

# --- types, bounds, empty file ----------------------------------------------------------------


def test_a_bool_is_not_an_integer(load_error, problem_at):
    err = load_error({"training": {"train_iters": True}})
    assert problem_at(err, "training.train_iters") == "training.train_iters = True: expected a valid integer"


def test_a_string_is_not_coerced_to_a_number(load_error, problem_at):
    err = load_error({"training": {"micro_batch_size": "2"}})
    assert "expected a valid integer" in problem_at(err, "training.micro_batch_size")


def test_an_integer_is_a_valid_float(load):
    assert load({"training": {"lr": 1}}).training.lr == 1.0


def test_seed_must_not_be_negative(load_error, problem_at):
    err = load_error({"training": {"seed": -1}})
    assert "expected greater than or equal to 0" in problem_at(err, "training.seed")


def test_an_empty_file_is_refused(write_config):
    path = write_config("# nothing but a comment\n")
    with pytest.raises(Exception, match="the config file is empty") as info:
        check_config(path)
    assert info.value.source == str(path)


def test_load_format_must_be_a_canonical_format_name(load_error, problem_at):
    err = load_error({"model": {"model_id": "m", "load_format": "difusers"}})
    assert "expected 'auto', 'dcp', 'diffusers', 'hf', 'safetensors' or 'pth'" in problem_at(
        err, "model.load_format"
    )


# --- paths ------------------------------------------------------------------------------------


@pytest.fixture
def known_model_m():
    """``m`` as a known model id (declared as a plugin's schema module would)."""
    declare_ids("model", "m")
    yield
    undeclare_ids("model", "m")


def paths_config(tmp_path):
    weights = tmp_path / "weights"
    weights.mkdir()
    return {
        "model": {
            "model_id": "m",
            "from_pretrained": str(weights),
            "checkpoint_path": str(tmp_path / "ckpt"),
        },
        "data": {"data_path": str(tmp_path / "meta.json"), "data_root": str(tmp_path / "clips")},
        "training": {"load": str(tmp_path / "run")},
    }


def test_every_missing_input_path_is_reported_at_once(write_config, tmp_path, known_model_m):
    with pytest.raises(Exception) as info:
        check_config(write_config(paths_config(tmp_path)), model_checks=False)
    assert sorted(info.value.paths) == [
        "data.data_path",
        "data.data_root",
        "model.checkpoint_path",
        "training.load",
    ]
    assert f"model.checkpoint_path = '{tmp_path / 'ckpt'}': path not found" in str(info.value)


def test_relative_paths_are_reported_with_the_working_directory(write_config, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(Exception, match=rf"path not found \(relative to the working directory {tmp_path}\)"):
        check_config(write_config({"data": {"data_path": "nowhere.json"}}))


def test_path_check_can_be_skipped(write_config, tmp_path, known_model_m):
    config = write_config(paths_config(tmp_path))
    assert check_config(config, check_paths=False, model_checks=False).config.training.load


def test_load_config_checks_paths_only_when_asked(load):
    assert load({"data": {"data_path": "/no/such/file"}}).data.data_path == "/no/such/file"


def test_recheck_of_a_config_object_checks_its_paths(load, tmp_path, known_model_m):
    cfg = load(paths_config(tmp_path))
    with pytest.raises(Exception, match="4 problems"):
        recheck_config(cfg, model_checks=False)
    assert recheck_config(cfg, check_paths=False, model_checks=False).config == cfg


# --- plugin pipeline schemas and built-in datasets --------------------------------------------


class ToyPipeline(PartialConfigModel):
    """Options of a toy pipeline."""

    steps: int = Field(default=3, ge=1)
    """Steps."""
    mode: str = "a"
    """Mode."""


@pytest.fixture
def toy_pipeline():
    register_pipeline_schema("toy_container", ToyPipeline)
    register_pipeline_schema("toy_single", ToyPipeline)
    yield
    unregister_schema("pipeline", "toy_container")
    unregister_schema("pipeline", "toy_single")


def test_container_pipeline_is_validated_by_the_containers_schema(
    toy_pipeline, load_error, container, problem_at
):
    data = container()
    data["model"]["pipeline"] = {"step": 2, "mode": 3}
    err = load_error(data)
    assert "did you mean `steps`?" in problem_at(err, "model.pipeline.step")
    assert "expected a valid string" in problem_at(err, "model.pipeline.mode")


def test_single_form_pipeline_is_validated_by_the_models_schema(toy_pipeline, load_error, problem_at):
    err = load_error({"model": {"model_id": "toy_single", "pipeline": {"steps": 0}}})
    assert "expected greater than or equal to 1" in problem_at(err, "model.pipeline.steps")


def test_a_partial_schema_keeps_only_the_keys_set(toy_pipeline, load):
    cfg = load({"model": {"model_id": "toy_single", "pipeline": {"steps": 5}}})
    assert cfg.model.pipeline == {"steps": 5}


def test_the_plain_container_takes_no_pipeline_options(load_error, problem_at):
    err = load_error({"model": {"models": {"p": {"model_id": "x"}}, "pipeline": {"steps": 1}}})
    assert "the plain container (no container_id) runs no pipeline" in problem_at(err, "model.pipeline")


def video_text(**dataset):
    return {"data": {"dataset_id": "video_text", "data_path": "m.json", "dataset": dataset}}


def test_video_text_frames_follow_the_frame_rule(load_error, problem_at):
    err = load_error(video_text(num_frames=10, height=8, width=8))
    assert problem_at(err, "data.dataset.num_frames") == (
        "data.dataset.num_frames = 10: violates frame_rule '4k+1'; the nearest valid values are 9 and 13"
    )


def test_video_text_rule_and_field_errors_come_in_one_report(load_error):
    err = load_error(video_text(num_frames=10, height=8, width=8, caption_dropout=2))
    assert sorted(err.paths) == ["data.dataset.caption_dropout", "data.dataset.num_frames"], str(err)


def test_video_text_needs_its_sizes_and_a_data_path(load_error):
    err = load_error({"data": {"dataset_id": "video_text", "dataset": {"num_frames": 9}}})
    assert sorted(err.paths) == ["data.data_path", "data.dataset.height", "data.dataset.width"], str(err)


def test_precomputed_latents_refuse_data_root(load_error, problem_at):
    data = {"data": {"dataset_id": "precomputed_latents", "data_path": "cache", "data_root": "clips"}}
    assert "reads no relative media paths" in problem_at(load_error(data), "data.data_root")


# --- warnings ---------------------------------------------------------------------------------


def test_a_long_run_without_a_save_dir_is_warned_about(load):
    cfg = load({"training": {"train_iters": 2000, "save_interval": 500}})
    (warning,) = config_warnings(cfg)
    assert str(warning) == (
        "training.save: null: this run of 2000 steps writes no checkpoint (one is due every 500 steps) "
        "and no metrics files (training.log_dir is null too); set training.save to keep its results"
    )


def test_a_short_run_without_a_save_dir_is_not_warned_about(load):
    assert config_warnings(load({"training": {"train_iters": 10, "save_interval": 10}})) == []


def test_a_section_no_schema_checked_is_warned_about_with_the_closest_id(load):
    class Known(ConfigModel):
        pass

    register_model_schema("wan_like", Known)
    try:
        (warning,) = config_warnings(load({"model": {"model_id": "wan_lik", "config": {"depth": 2}}}))
    finally:
        unregister_schema("model", "wan_like")
    assert warning.path == "model.config"
    assert "no model schema is registered for `wan_lik` (did you mean `wan_like`?)" in warning.message


def test_cli_prints_warnings_and_still_exits_0(write_config):
    path = write_config({"training": {"train_iters": 2000}})
    proc = subprocess.run(
        [sys.executable, "-m", "mm_config", "check", str(path)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith("warning: training.save: null: this run of 2000 steps")


def test_cli_no_path_check_skips_the_paths(write_config):
    path = write_config({"data": {"data_path": "/no/such/file"}})
    run = [sys.executable, "-m", "mm_config", "check", str(path)]
    checked = subprocess.run(run, capture_output=True, text=True, timeout=300)
    skipped = subprocess.run([*run, "--no-path-check"], capture_output=True, text=True, timeout=300)
    assert checked.returncode == 2 and "data.data_path = '/no/such/file': path not found" in checked.stderr
    assert skipped.returncode == 0, skipped.stderr
