"""Wan2.2 Flow-GRPO's set-up (``model.pipeline.grpo``, ``tiny_grpo.yaml``): the shipped config passes, and a
run that could not train it is refused by the config check before any weight is read, naming the key."""

from __future__ import annotations

import pytest
from mm_config import ConfigError, check_config
from wan22_train.configs import config_path
from wan22_train.tiny import make_tiny, tiny_overrides


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("tiny"), num_clips=2)


def _check(tiny, *overrides):
    return check_config(config_path("tiny_grpo.yaml"), [*tiny_overrides(tiny), *overrides], world_size=2,
                        check_paths=False)  # fmt: skip


def _refused(tiny, *overrides) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        _check(tiny, *overrides)
    return info.value


def test_the_shipped_config_passes_and_a_full_weight_policy_needs_a_reference_only_with_a_kl_term(tiny):
    _check(tiny)
    _check(tiny, "model.models.predictor.lora=null", "model.pipeline.grpo.kl_weight=0")
    err = _refused(tiny, "model.models.predictor.lora=null")
    assert err.paths == ["model.models.predictor"], str(err)
    assert "Flow-GRPO needs a reference: add the frozen sub-model `reference`" in str(err)


@pytest.mark.parametrize(
    ("overrides", "path", "words"),
    [
        (["training.rewards=[]"], "model.pipeline.grpo", "training.rewards lists none"),
        (
            ["model.pipeline.grpo.group_size=1"],
            "model.pipeline.grpo.group_size",
            "greater than or equal to 2",
        ),
        (
            ["model.pipeline.grpo.timestep_fraction=0"],
            "model.pipeline.grpo.timestep_fraction",
            "greater than 0",
        ),
        (["model.pipeline.grpo.noise_level=0"], "model.pipeline.grpo.noise_level", "greater than 0"),
        (["model.pipeline.grpo.group=4"], "model.pipeline.grpo.group", "group_size"),
        (["model.pipeline.expert=high_noise"], "model.pipeline.grpo", "expected expert `all` or `both`"),
        (["model.pipeline.dpo={beta: 100}"], "model.pipeline.grpo", "not with dpo"),
    ],
)
def test_a_grpo_run_that_cannot_train_is_refused_naming_the_key(tiny, overrides, path, words):
    err = _refused(tiny, *overrides)
    assert path in err.paths, str(err)
    assert words in str(err)
