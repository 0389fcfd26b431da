"""Wan2.2 DiffusionNFT's set-up (``model.pipeline.nft``, ``tiny_nft.yaml``): the shipped config passes, and a
run that could not train it is refused by the config check before any weight is read, naming the key. (With
both A14B experts: beside Flow-GRPO's, in test_wan_grpo.py.)"""

from __future__ import annotations

import pytest
from mm_config import ConfigError, check_config
from wan22_train.configs import config_path
from wan22_train.tiny import tiny_overrides


def _check(tmp_path, *overrides):
    return check_config(config_path("tiny_nft.yaml"), [*tiny_overrides(tmp_path), *overrides], world_size=2,
                        check_paths=False)  # fmt: skip


def test_the_shipped_config_passes_and_a_full_weight_policy_needs_a_reference_only_with_a_kl_term(tmp_path):
    _check(tmp_path)
    _check(tmp_path, "model.models.predictor.lora=null", "model.pipeline.nft.kl_weight=0")
    with pytest.raises(ConfigError) as info:
        _check(tmp_path, "model.models.predictor.lora=null")
    assert info.value.paths == ["model.models.predictor"], str(info.value)
    assert "DiffusionNFT needs a reference: add the frozen sub-model `reference`" in str(info.value)


NFT = "model.pipeline.nft"


@pytest.mark.parametrize(
    ("overrides", "path", "words"),
    [
        (["training.rewards=[]"], NFT, "training.rewards lists none"),
        ([f"{NFT}.group_size=1"], f"{NFT}.group_size", "greater than or equal to 2"),
        ([f"{NFT}.beta=0"], f"{NFT}.beta", "greater than 0"),
        ([f"{NFT}.advantage_clip=-1"], f"{NFT}.advantage_clip", "greater than 0"),
        ([f"{NFT}.kl_weight=-0.1"], f"{NFT}.kl_weight", "greater than or equal to 0"),
        ([f"{NFT}.timestep_fraction=1.5"], f"{NFT}.timestep_fraction", "less than or equal to 1"),
        ([f"{NFT}.sampling_steps=0"], f"{NFT}.sampling_steps", "greater than or equal to 1"),
        ([f"{NFT}.shift=0"], f"{NFT}.shift", "greater than 0"),
        ([f"{NFT}.old_decay_max=1"], f"{NFT}.old_decay_max", "less than 1"),
        ([f"{NFT}.old_decay_ramp=0"], f"{NFT}.old_decay_max", "never reached: old_decay_ramp is 0"),
        ([f"{NFT}.old_decay_max=0"], f"{NFT}.old_decay_ramp", "does nothing: old_decay_max is 0"),
        ([f"{NFT}.noise_level=0.7"], f"{NFT}.noise_level", "beta, group_size"),
        (["model.pipeline.expert=high_noise"], NFT, "expected expert `all` or `both`"),
        (["model.pipeline.task=i2v"], NFT, "rolls out text-to-video only"),
        (["model.pipeline.grpo={group_size: 4}"], NFT, "not with grpo"),
    ],
)
def test_an_nft_run_that_cannot_train_is_refused_naming_the_key(tmp_path, overrides, path, words):
    with pytest.raises(ConfigError) as info:
        _check(tmp_path, *overrides)
    assert path in info.value.paths, str(info.value)
    assert words in str(info.value)
