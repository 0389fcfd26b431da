"""Rewards (``training.rewards``): registered scorers on frames or latents, one score per sample, combined
with weights; a failing or NaN reward names itself and the sample; validation logs each reward's mean."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
from mm_config import ValidationConfig, registered_ids
from mm_trainer import REWARD_REGISTRY, ModelContainer, RewardError, Rewards, Validator, reward_register
from torch import nn


def _entry(id, weight=1.0, **options):
    return SimpleNamespace(id=id, weight=weight, options=options)


def _solid(rgb, frames=3, size=4):
    """A clip ``[1, 3, F, H, W]`` in [-1, 1] of one colour given on a 0-1 scale."""
    return (
        (torch.tensor(rgb, dtype=torch.float32) * 2 - 1).view(1, 3, 1, 1, 1).expand(1, 3, frames, size, size)
    )


@reward_register("test_latent_mean")
class LatentMean:
    inputs = "latents"

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = scale

    def __call__(self, samples, prompts):
        return self.scale * samples.flatten(1).mean(1)


@reward_register("test_fails_on_blue")
class FailsOnBlue:
    inputs = "frames"

    def __call__(self, samples, prompts):
        if any("blue" in p for p in prompts):
            raise RuntimeError("cannot score blue")
        return torch.zeros(len(prompts))


@reward_register("test_nan_on_second")
class NanOnSecond:
    inputs = "frames"

    def __call__(self, samples, prompts):
        return torch.tensor([0.0, math.nan, 1.0])[: len(prompts)]


@reward_register("test_per_element")
class PerElement:
    inputs = "latents"

    def __call__(self, samples, prompts):
        return samples


def test_colour_target_is_minus_the_distance_of_the_mean_colour_to_the_target():
    rewards = Rewards.from_config([_entry("colour_target", target=[1.0, 0.0, 0.0])])
    frames = torch.cat([_solid([1.0, 0.0, 0.0]), _solid([0.5, 0.5, 0.0])])
    scores = rewards.score(["a", "b"], frames=frames)
    torch.testing.assert_close(
        scores.each["colour_target"], torch.tensor([0.0, -math.sqrt(0.5)], dtype=torch.float64)
    )


def test_the_combined_reward_is_the_weighted_sum_of_rewards_on_frames_and_on_latents():
    rewards = Rewards.from_config(
        [_entry("colour_target", 2.0, target=[0.0, 0.0, 1.0]), _entry("test_latent_mean", -0.5, scale=3.0)]
    )
    frames, latents = _solid([0.0, 0.0, 0.0]), torch.full((1, 4, 2, 2, 2), 0.25)
    scores = rewards.score(["a"], frames=frames, latents=latents)
    assert rewards.needs == {"frames", "latents"}
    assert scores.each["colour_target"].item() == pytest.approx(-1.0)
    assert scores.each["test_latent_mean"].item() == pytest.approx(0.75)
    assert scores.total.item() == pytest.approx(2.0 * -1.0 - 0.5 * 0.75)


def test_a_reward_that_raises_names_itself_and_the_sample():
    rewards = Rewards.from_config([_entry("colour_target", target=[1, 0, 0]), _entry("test_fails_on_blue")])
    frames = torch.cat([_solid([1, 0, 0]), _solid([0, 0, 1])])
    with pytest.raises(RewardError, match=r"reward 'test_fails_on_blue' \(training.rewards\[1\]\) failed on clip B "
                                          r"\(prompt 'a blue ball'\): RuntimeError\('cannot score blue'\)"):  # fmt: skip
        rewards.score(["a red ball", "a blue ball"], frames=frames, names=["clip A", "clip B"])


def test_a_reward_that_returns_nan_names_itself_and_the_sample():
    rewards = Rewards.from_config([_entry("test_nan_on_second")])
    with pytest.raises(RewardError, match=r"reward 'test_nan_on_second' \(training.rewards\[0\]\) scored sample 1 "
                                          r"non-finite: \[nan\]"):  # fmt: skip
        rewards.score(["a", "b", "c"], frames=torch.zeros(3, 3, 1, 2, 2))


def test_a_reward_that_returns_a_score_per_element_instead_of_per_sample_is_refused():
    rewards = Rewards.from_config([_entry("test_per_element")])
    with pytest.raises(RewardError, match=r"reward 'test_per_element' .* returned a score of shape \(2, 3\): "
                                          r"expected one per sample, \(2,\)"):  # fmt: skip
        rewards.score(["a", "b"], latents=torch.zeros(2, 3))


def test_a_reward_without_the_input_it_scores_is_refused():
    rewards = Rewards.from_config([_entry("test_latent_mean")])
    with pytest.raises(ValueError, match="reward 'test_latent_mean' .* scores latents, and none were given"):
        rewards.score(["a"], frames=_solid([0, 0, 0]))


@reward_register("test_with_model")
class _WithModel:
    inputs = "frames"

    def __init__(self) -> None:
        self.model = nn.Linear(2, 2)

    def to(self, device):
        self.model.to(device)
        return self

    def __call__(self, samples, prompts):
        return torch.zeros(len(prompts))


def test_the_planner_refuses_a_reward_with_a_model_and_no_planned_build_and_builds_the_others_alike():
    with pytest.raises(
        ValueError, match=r"training.rewards\[1\] \('test_with_model'\) holds a model and has no"
    ):
        Rewards.from_config(
            [_entry("colour_target", target=[1, 0, 0]), _entry("test_with_model")], planned=True
        )
    planned = Rewards.from_config([_entry("colour_target", target=[1, 0, 0])], planned=True)
    assert planned.needs_frames and planned.modules() == []
    assert len(Rewards.from_config([_entry("test_with_model")]).modules()) == 1


def test_every_built_in_reward_has_an_options_schema_in_mm_config():
    built_in = {
        name for name, cls in REWARD_REGISTRY.registered().items() if cls.__module__.startswith("mm_trainer.")
    }
    assert built_in == {"colour_target", "clip_score", "distinctness", "tone_target"} and built_in <= set(
        registered_ids("reward")
    )


def test_with_skip_a_sample_a_reward_raises_on_is_left_out_and_logged_naming_reward_and_sample(caplog):
    rewards = Rewards.from_config(
        [_entry("colour_target", 2.0, target=[1, 0, 0]), _entry("test_fails_on_blue")], on_failure="skip"
    )
    frames = torch.cat([_solid([1, 0, 0]), _solid([0, 0, 1]), _solid([0, 0, 0])])
    with caplog.at_level("WARNING", logger="mm_trainer"):
        scores = rewards.score(
            ["a red ball", "a blue ball", "a black ball"], frames=frames, names=["A", "B", "C"]
        )
    assert scores.kept.tolist() == [True, False, True]
    assert scores.total[[0, 2]].tolist() == pytest.approx([0.0, -2.0])
    assert math.isnan(scores.total[1]) and math.isnan(scores.each["test_fails_on_blue"][1])
    (line,) = scores.skipped
    assert line.startswith(
        "reward 'test_fails_on_blue' (training.rewards[1]) failed on B (prompt 'a blue ball')"
    )
    assert "skipped 1 sample(s) (training.reward_failure: skip)" in caplog.text and line in caplog.text


def test_with_skip_a_nan_score_leaves_out_only_that_sample():
    scores = Rewards.from_config([_entry("test_nan_on_second")], on_failure="skip").score(
        ["a", "b", "c"], frames=torch.zeros(3, 3, 1, 2, 2)
    )
    assert scores.kept.tolist() == [True, False, True] and scores.total[[0, 2]].tolist() == [0.0, 1.0]
    assert scores.skipped == [
        "reward 'test_nan_on_second' (training.rewards[0]) scored sample 1 non-finite: nan"
    ]


def test_with_skip_a_score_of_the_wrong_shape_still_raises():
    with pytest.raises(RewardError, match="returned a score of shape"):
        Rewards.from_config([_entry("test_per_element")], on_failure="skip").score(
            ["a"], latents=torch.zeros(1, 3)
        )


def test_distinctness_scores_each_clip_by_its_rms_distance_to_its_groups_mean_clip():
    rewards = Rewards.from_config([_entry("distinctness")])
    frames = torch.cat([_solid([0.2] * 3), _solid([0.8] * 3), _solid([0.5] * 3), _solid([0.5] * 3)])
    scores = rewards.score(["red", "red", "blue", "blue"], frames=frames, groups=[7, 7, 3, 3])
    # group 7: clips at 2 * 0.2 - 1 and 2 * 0.8 - 1, each 0.6 from their mean; group 3: identical clips
    assert scores.each["distinctness"].tolist() == pytest.approx([0.6, 0.6, 0.0, 0.0])
    assert rewards.groupwise == ["distinctness"]


def test_a_groupwise_reward_without_group_ids_is_refused():
    with pytest.raises(ValueError, match="reward 'distinctness' .* is groupwise .* no group ids were given"):
        Rewards.from_config([_entry("distinctness")]).score(["a", "a"], frames=torch.zeros(2, 3, 1, 2, 2))


def test_a_group_of_samples_of_two_prompts_is_refused():
    with pytest.raises(ValueError, match=r"group 0 \(sample 0, sample 1\) holds several prompts"):
        Rewards.from_config([_entry("distinctness")]).score(
            ["a", "b"], frames=torch.zeros(2, 3, 1, 2, 2), groups=[0, 0]
        )


class Colours(ModelContainer):
    """A container that samples a solid clip whose colour its prompt names."""

    RGB = {"red": [1.0, 0.0, 0.0], "grey": [0.5, 0.5, 0.5]}

    def __init__(self) -> None:
        super().__init__({"predictor": nn.Linear(2, 2)}, trainable=("predictor",))

    def sample(self, prompt, *, seed, num_frames, height, width, **_):
        return _solid(self.RGB[prompt.split()[1]], num_frames, height)[0]


class Shades(Colours):
    """Like :class:`Colours`, the clip darker by a tenth per unit of its seed."""

    def sample(self, prompt, *, seed, **size):
        return super().sample(prompt, seed=seed, **size) * (1 - seed / 10)


def test_validation_with_skip_leaves_a_failing_clip_out_of_the_statistics_and_counts_it(tmp_path):
    section = ValidationConfig(prompts=["a red ball", "a grey blue ball"], seeds=[0, 0], num_frames=1, height=4,
                               width=4)  # fmt: skip
    rewards = Rewards.from_config([_entry("colour_target", target=[1, 0, 0]), _entry("test_fails_on_blue")],
                                  on_failure="skip")  # fmt: skip
    out = Validator(Colours(), section, data=None, seed=0, out_dir=tmp_path, device=torch.device("cpu"),
                    rewards=rewards).run(500)  # fmt: skip
    assert (
        out["val_reward_skipped"] == 1 and out["val_reward_colour_target"] == 0.0 and out["val_reward"] == 0.0
    )
    written = json.loads((tmp_path / "validation" / "iter_0000500" / "rewards.json").read_text())
    assert written[1] == {"prompt": "a grey blue ball", "seed": 0, "skipped": True}


def test_validation_scores_the_clips_of_one_prompt_as_a_group(tmp_path):
    section = ValidationConfig(prompts=["a red ball", "a grey ball", "a red ball"], seeds=[0, 3, 5], num_frames=1,
                               height=4, width=4)  # fmt: skip
    out = Validator(Shades(), section, data=None, seed=0, out_dir=tmp_path, device=torch.device("cpu"),
                    rewards=Rewards.from_config([_entry("distinctness")])).run(500)  # fmt: skip
    # red clips (seeds 0 and 5): 1.0 and 0.5 in the red channel, -1.0 and -0.5 in the others: each 0.25 from
    # their mean in every element; the grey clip is a group of its own
    scores = json.loads((tmp_path / "validation" / "iter_0000500" / "rewards.json").read_text())
    assert [s["reward_distinctness"] for s in scores] == pytest.approx([0.25, 0.0, 0.25])
    assert out["val_reward_distinctness_max"] == pytest.approx(0.25)


def test_validation_logs_each_rewards_mean_and_the_weighted_sums_mean(tmp_path):
    section = ValidationConfig(prompts=["a red ball", "a grey ball"], num_frames=1, height=4, width=4, fps=4)
    rewards = Rewards.from_config([_entry("colour_target", 2.0, target=[1.0, 0.0, 0.0])])
    validator = Validator(Colours(), section, data=None, seed=0, out_dir=tmp_path, device=torch.device("cpu"),
                          write=False, rewards=rewards)  # fmt: skip
    out = validator.run(500)
    grey = -math.sqrt(0.25 + 0.25 + 0.25)
    assert out["val_reward_colour_target"] == pytest.approx(grey / 2)
    assert out["val_reward_colour_target_std"] == pytest.approx(-grey / 2)  # of [0, grey]
    assert (out["val_reward_colour_target_min"], out["val_reward_colour_target_max"]) == pytest.approx(
        (grey, 0.0)
    )
    assert out["val_reward"] == pytest.approx(2.0 * grey / 2)


def test_validation_writes_each_clips_scores_beside_the_clips(tmp_path):
    section = ValidationConfig(
        prompts=["a red ball", "a grey ball"], seeds=[4, 9], num_frames=1, height=4, width=4
    )
    rewards = Rewards.from_config([_entry("colour_target", 2.0, target=[1.0, 0.0, 0.0])])
    Validator(Colours(), section, data=None, seed=0, out_dir=tmp_path, device=torch.device("cpu"),
              rewards=rewards).run(500)  # fmt: skip
    written = tmp_path / "validation" / "iter_0000500"
    scores = json.loads((written / "rewards.json").read_text())
    grey = -math.sqrt(0.75)
    assert [(s["prompt"], s["seed"]) for s in scores] == [("a red ball", 4), ("a grey ball", 9)]
    assert [s["reward_colour_target"] for s in scores] == pytest.approx([0.0, grey])
    assert [s["reward"] for s in scores] == pytest.approx([0.0, 2 * grey])
    assert (written / "0.mp4").is_file()


def test_validation_names_the_prompt_of_a_reward_that_fails(tmp_path):
    section = ValidationConfig(prompts=["a red ball", "a grey blue ball"], seeds=[3, 7], num_frames=1, height=4,
                               width=4)  # fmt: skip
    validator = Validator(Colours(), section, data=None, seed=0, out_dir=tmp_path, device=torch.device("cpu"),
                          write=False, rewards=Rewards.from_config([_entry("test_fails_on_blue")]))  # fmt: skip
    with pytest.raises(RewardError, match=r"failed on validation prompt 1 \('a grey blue ball', seed 7\)"):
        validator.run(500)


def test_validation_refuses_a_reward_on_latents_before_training(tmp_path):
    section = ValidationConfig(prompts=["a red ball"], num_frames=1, height=4, width=4)
    with pytest.raises(ValueError, match=r"the rewards \['test_latent_mean'\] need \['latents'\]"):
        Validator(Colours(), section, data=None, seed=0, out_dir=tmp_path, device=torch.device("cpu"),
                  rewards=Rewards.from_config([_entry("test_latent_mean")]))  # fmt: skip


def test_the_rollout_scorer_decodes_only_for_rewards_on_frames_and_gives_nan_for_a_skipped_clip():
    from mm_trainer import RolloutScorer

    decoded = []

    def decode(latents):
        decoded.append(latents.shape[0])
        return torch.zeros(latents.shape[0], 3, 1, 2, 2)

    latents = torch.arange(3.0).view(3, 1, 1, 1, 1)
    on_latents = RolloutScorer(Rewards.from_config([_entry("test_latent_mean", scale=2.0)]), decode)
    rewards, logged = on_latents(latents, ["a", "a", "b"], groups=[0, 0, 1], names=["x", "y", "z"])
    assert decoded == [] and rewards.tolist() == [0.0, 2.0, 4.0]
    assert logged == pytest.approx(
        {"reward": 2.0, "reward_std": math.sqrt(8 / 3), "reward_test_latent_mean": 2.0}
    )
    on_frames = RolloutScorer(Rewards.from_config([_entry("test_nan_on_second")], on_failure="skip"), decode)
    rewards, logged = on_frames(latents, ["a", "a", "b"], groups=[0, 0, 1], names=["x", "y", "z"])
    assert decoded == [3] and math.isnan(rewards[1]) and rewards[[0, 2]].tolist() == [0.0, 1.0]
    assert logged["reward_skipped"] == 1.0 and logged["reward"] == 0.5


def _sine(freq: float, rate: int = 8000, seconds: float = 0.5) -> torch.Tensor:
    """A stereo sine ``[1, 2, S]`` with a DC offset (which is no tone)."""
    t = torch.arange(int(rate * seconds)) / rate
    wave = 0.3 + 0.5 * torch.sin(2 * math.pi * freq * t)
    return torch.stack([wave, 0.5 * wave])[None]


def test_tone_target_is_minus_the_octaves_between_the_dominant_frequency_and_the_target():
    rewards = Rewards.from_config([_entry("tone_target", frequency=440.0)])
    waves = torch.cat([_sine(440.0), _sine(880.0), _sine(220.0), _sine(523.25)])
    scores = rewards.score(["a"] * 4, audio=waves, sample_rate=8000).total
    assert scores.tolist() == pytest.approx([0.0, -1.0, -1.0, -math.log2(524 / 440)], abs=1e-3)  # 2 Hz bins
    with pytest.raises(ValueError, match="sample_rate"):
        rewards.score(["a"], audio=waves[:1])


def test_the_rollout_scorer_decodes_the_audio_only_for_rewards_on_audio_and_refuses_a_model_without_a_decoder():
    from mm_trainer import RolloutScorer

    audio = Rewards.from_config([_entry("tone_target", frequency=440.0), _entry("test_latent_mean")])
    with pytest.raises(ValueError, match=r"score decoded audio, and the model has no decode_audio"):
        RolloutScorer(audio, None)
    decoded = []

    def decode_audio(latents):
        decoded.append(latents.shape)
        return torch.cat([_sine(440.0), _sine(880.0)]), 8000

    scorer = RolloutScorer(audio, None, decode_audio)
    assert (
        scorer.needs_audio
        and not RolloutScorer(Rewards.from_config([_entry("test_latent_mean")]), None).needs_audio
    )
    latents = torch.zeros(2, 1, 1, 1, 1)
    rewards, logged = scorer(
        latents, ["a", "a"], groups=[0, 0], names=["x", "y"], audio=torch.zeros(2, 4, 3, 2)
    )
    assert decoded == [(2, 4, 3, 2)] and rewards.tolist() == pytest.approx([0.0, -1.0], abs=1e-3)
    assert logged["reward_tone_target"] == pytest.approx(-0.5, abs=1e-3)
    with pytest.raises(ValueError, match="score audio, and the rollouts have none"):
        scorer(latents, ["a", "a"], groups=[0, 0], names=["x", "y"])


def _score_blue_on_rank_1(rank: int, world_size: int) -> str:
    from mm_trainer import RolloutScorer

    scorer = RolloutScorer(
        Rewards.from_config([_entry("test_fails_on_blue")]), lambda z: torch.zeros(2, 3, 1, 2, 2)
    )
    prompts = ["a blue square", "a blue square"] if rank == 1 else ["a red circle", "a red circle"]
    try:
        scorer(
            torch.zeros(2, 1, 1, 1, 1),
            prompts,
            groups=[0, 0],
            names=[f"rank {rank} clip 0", f"rank {rank} clip 1"],
        )
    except RewardError as error:
        return str(error)
    return "no error"


@pytest.mark.slow  # two forked gloo ranks
def test_a_reward_failing_on_one_ranks_rollouts_raises_the_same_error_on_every_rank(distributed):
    """Each rank scores its own prompts' rollouts: the rank whose reward failed and the others all stop, with
    the message naming the reward and the clip (no rank left waiting in the step's collectives)."""
    messages = distributed(_score_blue_on_rank_1, 2)
    assert "reward 'test_fails_on_blue' (training.rewards[0]) failed on rank 1 clip 0" in messages[1]
    assert messages[0] == f"{messages[1]} (on rank 1; every rank stops)"
