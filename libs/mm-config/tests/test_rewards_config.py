"""``training.rewards``: each entry a registered reward id with a weight and options its schema accepts;
anything else is refused at load, naming the key."""

from __future__ import annotations

from mm_config import ConfigModel, register_reward_schema, unregister_schema

VALIDATION = {"prompts": ["a ball"]}


def _with_rewards(container, rewards, validation=VALIDATION):
    return container(training={"save": "runs/x", "validation": validation, "rewards": rewards})


def test_a_built_in_reward_loads_with_its_options_and_weight(container, load):
    rewards = load(
        _with_rewards(container, [{"id": "colour_target", "weight": 2.0, "options": {"target": [1, 0, 0]}}])
    )
    (reward,) = rewards.training.rewards
    assert (reward.id, reward.weight, reward.options) == ("colour_target", 2.0, {"target": [1.0, 0.0, 0.0]})


def test_an_unknown_reward_id_is_refused_naming_the_closest_known_one(container, load_error, problem_at):
    err = load_error(_with_rewards(container, [{"id": "colour_targte", "options": {"target": [1, 0, 0]}}]))
    assert "unknown reward id; did you mean `colour_target`?" in problem_at(err, "training.rewards[0].id")


def test_options_the_reward_does_not_take_are_refused_with_their_path(container, load_error, problem_at):
    err = load_error(
        _with_rewards(container, [{"id": "colour_target", "options": {"target": [1, 0, 0], "tint": 1}}])
    )
    assert "unknown key" in problem_at(err, "training.rewards[0].options.tint")


def test_a_bad_option_value_is_refused_with_its_path(container, load_error, problem_at):
    err = load_error(_with_rewards(container, [{"id": "colour_target", "options": {"target": [0, 1.5, 0]}}]))
    assert "must lie in [0, 1]" in problem_at(err, "training.rewards[0].options.target[1]")


def test_a_missing_option_is_refused(container, load_error, problem_at):
    err = load_error(_with_rewards(container, [{"id": "colour_target"}]))
    assert "Field required" in problem_at(err, "training.rewards[0].options.target")


def test_a_reward_listed_twice_is_refused(container, load_error, problem_at):
    entry = {"id": "colour_target", "options": {"target": [1, 0, 0]}}
    err = load_error(_with_rewards(container, [entry, entry]))
    assert "listed twice" in problem_at(err, "training.rewards[1].id")


def test_a_zero_weight_is_refused(container, load_error, problem_at):
    err = load_error(
        _with_rewards(container, [{"id": "colour_target", "weight": 0, "options": {"target": [1, 0, 0]}}])
    )
    assert "must not be 0" in problem_at(err, "training.rewards[0].weight")


def test_rewards_without_validation_prompts_are_refused(container, load_error, problem_at):
    held_out_only = {"data_path": "held_out.json"}
    err = load_error(
        _with_rewards(container, [{"id": "colour_target", "options": {"target": [1, 0, 0]}}], held_out_only)
    )
    assert "set training.validation.prompts" in problem_at(err, "training.rewards")


def test_a_plugin_reward_is_known_through_the_schema_it_registers(container, load):
    class Sharpness(ConfigModel):
        radius: int = 1

    register_reward_schema("sharpness", Sharpness)
    try:
        (reward,) = load(_with_rewards(container, [{"id": "sharpness", "weight": -0.5}])).training.rewards
    finally:
        unregister_schema("reward", "sharpness")
    assert (reward.id, reward.weight, reward.options) == ("sharpness", -0.5, {"radius": 1})


def test_mm_config_check_refuses_an_unknown_reward_id_naming_its_key(container, write_config, capsys):
    from mm_config.cli import main

    path = write_config(_with_rewards(container, [{"id": "image_reward", "options": {"target": [1, 0, 0]}}]))
    assert main(["check", str(path), "--no-path-check"]) == 2
    err = capsys.readouterr().err
    assert (
        "training.rewards[0].id = 'image_reward': unknown reward id; expected one of: clip_score, colour_target"
        in err
    )


def test_a_model_reward_without_a_model_path_is_refused(container, load_error, problem_at):
    err = load_error(_with_rewards(container, [{"id": "clip_score"}]))
    assert "Field required" in problem_at(err, "training.rewards[0].options.model_path")


def test_mm_config_check_refuses_a_model_path_that_does_not_exist_naming_key_and_path(
    container, write_config, capsys, tmp_path
):
    from mm_config.cli import main

    missing = tmp_path / "no_clip_here"
    path = write_config(
        _with_rewards(container, [{"id": "clip_score", "options": {"model_path": str(missing)}}])
    )
    assert main(["check", str(path)]) == 2
    assert f"training.rewards[0].options.model_path = '{missing}': path not found" in capsys.readouterr().err


def test_a_model_path_holding_another_model_type_is_refused_by_the_path_check(
    container, write_config, capsys, tmp_path
):
    from mm_config.cli import main

    (tmp_path / "t5").mkdir()
    (tmp_path / "t5" / "config.json").write_text('{"model_type": "t5"}')
    rewards = [{"id": "clip_score", "options": {"model_path": str(tmp_path / "t5")}}]
    assert main(["check", str(write_config(_with_rewards(container, rewards)))]) == 2
    assert "its config.json has model_type 't5'; expected one of ['clip']" in capsys.readouterr().err


def test_reward_failure_skip_without_rewards_is_refused(container, load_error, problem_at):
    err = load_error(container(training={"save": "runs/x", "reward_failure": "skip"}))
    assert "training.rewards lists none" in problem_at(err, "training.reward_failure")
