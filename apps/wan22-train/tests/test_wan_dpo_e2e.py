"""Diffusion-DPO through the trainer (``tiny_dpo.yaml``: a LoRA policy, its base with the adapters off as the
reference, the phase ``dpo``): the same losses, margins and held-out loss at 2 ranks + Ulysses 2 and at 1
rank, a resume at another layout, both A14B experts in one run, and a few dozen steps raise the implicit
reward margin of held-out pairs above 0."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from wan22_train.cli import main as wan22_main
from wan22_train.configs import config_path
from wan22_train.pairs import make_colour_pairs
from wan22_train.tiny import make_tiny, tiny_overrides

pytestmark = pytest.mark.slow

LOGGED = ("loss_dpo", "dpo_margin", "dpo_accuracy", "val_loss")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """The tiny set of 8 clips and its pairs by closeness to red."""
    folder = make_tiny(tmp_path_factory.mktemp("dpo"))
    make_colour_pairs(folder, [1.0, 0.0, 0.0])
    return folder


def args(tiny: Path, save: Path, steps: int, validate_every: int, *extra: str) -> list[str]:
    pairs = tiny / "pairs"
    return [
        "--config", str(config_path("tiny_dpo.yaml")), *tiny_overrides(tiny), f"data.data_path={pairs / 'train.json'}",
        f"training.validation.data_path={pairs / 'held_out.json'}", f"training.validation.interval={validate_every}",
        f"training.save={save}", f"training.train_iters={steps}", f"training.save_interval={steps}",
        "training.tensorboard=false", *extra,
    ]  # fmt: skip


def records(save: Path) -> list[dict]:
    return [json.loads(line) for line in (save / "metrics.jsonl").read_text().splitlines()]


def test_dpo_at_2_ranks_with_ulysses_2_logs_the_losses_margins_and_held_out_loss_of_1_rank(
    tiny, tmp_path, main_forked
):
    main_forked(wan22_main, args(tiny, tmp_path / "two", 4, 2), nproc=2)
    main_forked(wan22_main, args(tiny, tmp_path / "one", 4, 2, "parallel.ulysses_parallel_size=1"), nproc=1)
    two, one = records(tmp_path / "two"), records(tmp_path / "one")
    assert [r["step"] for r in two] == [r["step"] for r in one] == [1, 2, 3, 4]
    assert [("val_loss" in r) for r in two] == [False, True, False, True]
    assert two[0]["loss_dpo"] == pytest.approx(math.log(2), abs=1e-6)  # the policy starts as its reference
    assert any(abs(r["dpo_margin"]) > 1e-3 for r in two[1:]), "the policy never left its reference"
    # The margin is beta times a difference of four fp32 denoising errors of order 1, each summed in another
    # order at the other layout (Ulysses' attention): they agree to ~1e-7 each, the margin to ~beta * 1e-6
    # (seen: 2e-4 at beta 500 on margins of 0.15-0.2), and so does the loss (its slope in the margin is < 1).
    beta = 500.0
    tolerance = {"loss_dpo": beta * 1e-6, "dpo_margin": beta * 1e-6, "dpo_accuracy": 0.0, "val_loss": 1e-5}
    for key in LOGGED:
        want = torch.tensor([r.get(key, math.nan) for r in one], dtype=torch.float64)
        have = torch.tensor([r.get(key, math.nan) for r in two], dtype=torch.float64)
        torch.testing.assert_close(
            have, want, rtol=0, atol=tolerance[key], equal_nan=True, msg=f"{key}: {have} vs {want}"
        )


def test_a_few_dozen_dpo_steps_raise_the_implicit_reward_margin_of_held_out_pairs_above_0(
    tiny, tmp_path, main_forked
):
    """The held-out loss is the mean of ``-log sigmoid(margin)`` over the held-out pairs (4 fixed timesteps
    each): ``log 2`` for the reference itself, and below it only if the mean margin is above 0 (the
    function is convex and decreasing). Pairs held out: others of the same clips, never trained on. The
    validation clips are scored by ``training.rewards`` (the colour reward the pairs were ranked by)."""
    prompts = ["a circle moving up", "a square moving left"]
    clips = {"prompts": f"[{', '.join(prompts)}]", "num_frames": 9, "height": 32, "width": 32, "fps": 8,
             "sampling_steps": 4}  # fmt: skip
    extra = (
        "parallel.ulysses_parallel_size=1", "training.rewards=[{id: colour_target, options: {target: [1.0, 0.0, 0.0]}}]",
        *[f"training.validation.{key}={value}" for key, value in clips.items()],
    )  # fmt: skip
    main_forked(wan22_main, args(tiny, tmp_path / "run", 30, 30, *extra), nproc=1)
    got = records(tmp_path / "run")
    held_out = got[-1]["val_loss"]
    assert held_out < math.log(2) - 0.1, f"held-out DPO loss {held_out:.4f}: the held-out margin did not rise"
    assert sum(r["dpo_accuracy"] for r in got[-10:]) / 10 > 0.5
    scores = json.loads((tmp_path / "run" / "validation" / "iter_0000030" / "rewards.json").read_text())
    assert [s["prompt"] for s in scores] == prompts and all(-math.sqrt(3) <= s["reward"] <= 0 for s in scores)
    mean = sum(s["reward_colour_target"] for s in scores) / len(scores)
    assert got[-1]["val_reward_colour_target"] == pytest.approx(mean) and got[-1][
        "val_reward"
    ] == pytest.approx(mean)


class NanOnSquare:
    """A reward that scores every clip 0, and a clip of a square NaN."""

    inputs = "frames"

    def __call__(self, samples, prompts):
        return torch.tensor([math.nan if "square" in p else 0.0 for p in prompts])


def test_with_reward_failure_skip_a_clip_a_reward_fails_on_is_left_out_of_validations_rewards_and_counted(
    tiny, tmp_path, main_forked
):
    from mm_config import ConfigModel, register_reward_schema, unregister_schema
    from mm_trainer import reward_register

    reward_register("test_nan_on_square")(NanOnSquare)
    register_reward_schema("test_nan_on_square", type("NoOptions", (ConfigModel,), {}))
    prompts = ["a circle moving up", "a square moving left"]
    extra = (
        "parallel.ulysses_parallel_size=1", "training.reward_failure=skip",
        "training.rewards=[{id: colour_target, options: {target: [1.0, 0.0, 0.0]}}, {id: test_nan_on_square}]",
        f"training.validation.prompts=[{', '.join(prompts)}]", "training.validation.num_frames=5",
        "training.validation.height=16", "training.validation.width=16", "training.validation.sampling_steps=1",
        "training.validation.data_path=null",  # no held-out loss: the clips' rewards only
    )  # fmt: skip
    try:
        main_forked(wan22_main, args(tiny, tmp_path / "run", 1, 1, *extra), nproc=1)
    finally:
        unregister_schema("reward", "test_nan_on_square")
    (record,) = records(tmp_path / "run")
    circle, square = json.loads(
        (tmp_path / "run" / "validation" / "iter_0000001" / "rewards.json").read_text()
    )
    assert (
        square == {"prompt": prompts[1], "seed": 1, "skipped": True}
        and circle["reward_test_nan_on_square"] == 0
    )
    assert record["val_reward_skipped"] == 1 and record["val_reward"] == pytest.approx(circle["reward"])
    assert record["val_reward_colour_target_std"] == 0  # of the one clip kept


def test_with_both_experts_each_step_trains_and_compares_the_expert_of_its_timestep(
    tiny, tmp_path, main_forked
):
    """``expert: both`` with LoRA on both experts: a step's pairs go through the expert its (per-step) timestep
    belongs to, policy and reference alike. So a step whose expert no earlier step trained has the margin 0
    exactly (that expert's adapters are still B = 0: the policy is its reference), and every later step of
    either expert has a margin of its own."""
    from mm_pipelines import SampleRNG
    from wan22_train.pipeline import Wan22Pipeline

    steps, lora = 7, '{target_modules: ["blocks.{*}.self_attn.?", "blocks.{*}.ffn.0"], rank: 4, alpha: 4}'
    both = (
        "parallel.ulysses_parallel_size=1", "model.pipeline.expert=both",
        f"model.models.predictor_low={{model_id: wan2_2_predictor, from_pretrained: {tiny / 'transformer'}, lora: {lora}}}",
        'parallel.fsdp_plan.apply_modules=["predictor.blocks.{*}", "predictor_low.blocks.{*}", "text_encoder.encoder.block.{*}"]',
        "training.phases.dpo.submodels=[predictor, predictor_low]",
    )  # fmt: skip
    main_forked(wan22_main, args(tiny, tmp_path / "run", steps, steps, *both), nproc=1)
    pipeline = Wan22Pipeline.from_options({"expert": "both"})
    experts = [
        int(pipeline.scheduler.draw_indices(SampleRNG(seed=1234, step=s, sample_ids=[0, 1]), "step")[0])
        < pipeline.boundary_index
        for s in range(steps)
    ]
    assert set(experts) == {True, False}, "the steps drew one expert only: pick more steps"
    first = [experts.index(e) == s for s, e in enumerate(experts)]
    margins = [r["dpo_margin"] for r in records(tmp_path / "run")]
    assert [m == 0.0 for m in margins] == first, f"experts (high: True) {experts}, margins {margins}"


def test_a_dpo_run_stopped_at_1_rank_resumes_at_2_ranks_with_ulysses_2_with_the_uninterrupted_losses(
    tiny, tmp_path, main_forked
):
    """The checkpoint holds the policy's adapters and the phase's optimizer; the reference (the base) reloads
    from its pretrained folder. Stopped after step 2 of 4 (its later checkpoint and records removed), the run
    resumes at another layout and logs the uninterrupted run's steps 3 and 4."""
    import shutil

    one_rank = ("parallel.ulysses_parallel_size=1", "training.save_interval=2")
    main_forked(wan22_main, args(tiny, tmp_path / "whole", 4, 4, *one_rank), nproc=1)
    stopped = shutil.copytree(tmp_path / "whole", tmp_path / "stopped")
    shutil.rmtree(stopped / "iter_0000004")
    (stopped / "latest_checkpointed_iteration.txt").write_text("2\n")
    lines = (stopped / "metrics.jsonl").read_text().splitlines()[:2]
    (stopped / "metrics.jsonl").write_text("".join(line + "\n" for line in lines))
    main_forked(wan22_main, args(tiny, stopped, 4, 4, "training.save_interval=2"), nproc=2)
    whole, resumed = records(tmp_path / "whole"), records(stopped)
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    for key, atol in (("loss_dpo", 500 * 1e-6), ("dpo_margin", 500 * 1e-6), ("dpo_accuracy", 0.0)):
        torch.testing.assert_close(
            torch.tensor([r[key] for r in resumed[2:]]),
            torch.tensor([r[key] for r in whole[2:]]),
            rtol=0,
            atol=atol,
        )
    assert any(abs(r["dpo_margin"]) > 1e-3 for r in whole[2:])
