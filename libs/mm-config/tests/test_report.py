"""One report lists every problem: field errors and rule violations together, without echoes."""

from __future__ import annotations

from mm_config import ConfigError, Problem


def test_five_independent_mistakes_are_all_reported(load_error, container):
    data = container(
        parallel={"ulysses_parallel_sise": 2},  # 1. typo'd key
        training={
            "lr": "fast",  # 2. bad type
            "trainable_submodels": ["predictor", "ae"],  # 3. frozen sub-model trained (cross-section)
            "global_batch_size": 3,
        },  # 4. batch arithmetic (cross-section)
        data={"prefetch_factor": 2},  # 5. section rule
    )
    err = load_error(data, world_size=2)
    assert sorted(err.paths) == sorted(
        [
            "parallel.ulysses_parallel_sise",
            "training.lr",
            "training.trainable_submodels[1]",
            "training.global_batch_size",
            "data.prefetch_factor",
        ]
    ), str(err)
    text = str(err)
    assert text.startswith(f"{err.source}: 5 problems in the config:")
    assert "did you mean `ulysses_parallel_size`?" in text
    assert "training.lr = 'fast': expected a valid number" in text
    assert "sub-model `ae` is frozen" in text
    assert "data-parallel size (2 = world 2 / ulysses x ring 1) = 2" in text
    assert "needs data.num_workers > 0" in text


def test_rules_that_read_a_broken_key_are_not_echoed(load_error):
    # ulysses is invalid; the batch rule would read its default and complain spuriously.
    err = load_error(
        {"parallel": {"ulysses_parallel_size": "four"}, "training": {"global_batch_size": 2}}, world_size=8
    )
    assert err.paths == ["parallel.ulysses_parallel_size"], str(err)


def test_section_rules_are_reported_next_to_field_errors_of_the_same_section(load_error):
    err = load_error({"training": {"seed": "x", "min_lr": 1.0, "lr": 0.1}})
    assert sorted(err.paths) == ["training.min_lr", "training.seed"], str(err)


def test_config_error_is_a_value_error_listing_problems():
    err = ConfigError([Problem(("a", "b", 2), "expected x", 5), Problem(("c",), "bad")], "f.yaml")
    assert isinstance(err, ValueError)
    assert str(err) == "f.yaml: 2 problems in the config:\n  - a.b[2] = 5: expected x\n  - c: bad"
    assert err.paths == ["a.b[2]", "c"]


def test_direct_model_validation_raises_pydantic_error_with_the_rule_text():
    import pytest
    from mm_config import TrainConfig
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=r"must divide the world size 3"):
        TrainConfig.model_validate({"parallel": {"ulysses_parallel_size": 2}}, context={"world_size": 3})


def test_a_problem_shows_a_long_path_whole_and_cuts_a_long_list():
    """A path is what the user must find (a deep temporary folder: 150+ characters); a long list is cut."""
    path = "/tmp/" + "/".join(["a_rather_deep_folder"] * 9) + "/no_model_here"
    assert f"model_path = '{path}': path not found" in str(Problem(("model_path",), "path not found", path))
    assert str(Problem(("values",), "too long", list(range(100)))).endswith("...: too long")
