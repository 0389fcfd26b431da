"""Flow-GRPO, DiffusionNFT and Diffusion-DPO through the trainer at 1 rank: with both A14B experts in one GRPO
run each step's log-probabilities and gradient come from the expert of its trained timestep, and a GRPO, an
NFT and a DPO run SIGKILLed mid-run resume from their last checkpoint with the uninterrupted run's rewards and
losses.

Each mode runs once: ``wan22-train``'s ``main`` in a forked child (``killed_after``) of 4 steps with a
checkpoint every 2nd, SIGKILLed once it logged step 3 (its step-2 checkpoint complete); until then it is the
uninterrupted run. Its resume (``main_forked``) trains steps 3 and 4 again: step 3 must log what the killed
run logged."""

from __future__ import annotations

import json
import math
import os
import signal
from pathlib import Path

import pytest
from mm_pipelines import SampleRNG
from wan22_train.cli import main as wan22_main
from wan22_train.configs import config_path
from wan22_train.pairs import make_colour_pairs
from wan22_train.tiny import make_tiny, tiny_overrides

pytestmark = pytest.mark.slow

STEPS = 4
#: The run's seed: the grpo steps train the sampler steps of the low-noise, high-noise, high-noise expert.
SEED = 0
LORA = '{target_modules: ["blocks.{*}.self_attn.?", "blocks.{*}.ffn.0"], rank: 4, alpha: 4}'
#: Per mode: its config, its overrides at 1 rank, and the logged values a resumed step must repeat.
MODES = {
    "grpo": (
        "tiny_grpo.yaml",
        [
            "model.pipeline.expert=both", "model.pipeline.grpo.group_size=2",
            "model.pipeline.grpo.timestep_fraction=0.25",  # one trained step of 4: one expert per step
            "model.models.predictor_low={model_id: wan2_2_predictor, from_pretrained: TINY/transformer, "
            f"lora: {LORA}}}",
            'parallel.fsdp_plan.apply_modules=["predictor.blocks.{*}", "predictor_low.blocks.{*}", '
            '"text_encoder.encoder.block.{*}"]',
            "training.phases.grpo.submodels=[predictor, predictor_low]",
        ],
        ("loss_grpo", "reward", "reward_std", "grpo_kl", "grpo_clip_fraction"),
    ),
    "nft": (  # its old policy (an EMA of the adapters) is per-rank checkpointed state a resume must restore
        "tiny_nft.yaml",
        ["model.pipeline.nft.group_size=2", "model.pipeline.nft.old_decay_ramp=0.5"],
        ("loss_nft", "reward", "reward_std", "nft_kl", "nft_old_deviation", "nft_old_decay"),
    ),
    "dpo": (
        "tiny_dpo.yaml",
        ["data.data_path=TINY/pairs/train.json", "training.validation=null"],
        ("loss_dpo", "dpo_margin", "dpo_accuracy"),
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """The tiny set and its pairs by closeness to red."""
    folder = make_tiny(tmp_path_factory.mktemp("reward_modes"))
    make_colour_pairs(folder, [1.0, 0.0, 0.0])
    return folder


def argv(tiny: Path, mode: str, save: Path) -> list[str]:
    config, overrides, _ = MODES[mode]
    return [
        "--config", str(config_path(config)), *tiny_overrides(tiny), "parallel.ulysses_parallel_size=1",
        *[o.replace("TINY", str(tiny)) for o in overrides], f"training.save={save}", f"training.train_iters={STEPS}",
        "training.save_interval=2", "training.tensorboard=false", "training.micro_batch_size=1",
        f"training.seed={SEED}",
    ]  # fmt: skip


def records(save: Path) -> list[dict]:
    return [json.loads(line) for line in (save / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def killed(tiny, tmp_path_factory, killed_after):
    """``killed(mode)``: the folder of the mode's run SIGKILLed after it logged step 3, and its records then
    (the uninterrupted run's steps 1-3); run once per module."""
    runs: dict[str, tuple[Path, list[dict]]] = {}

    def run(mode: str) -> tuple[Path, list[dict]]:
        if mode not in runs:
            save = tmp_path_factory.mktemp(f"{mode}_killed")
            status = killed_after(wan22_main, argv(tiny, mode, save), save, 3)
            assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, f"not killed: {status}"
            runs[mode] = (save, records(save))
        return runs[mode]

    return run


def test_with_both_experts_each_grpo_steps_log_prob_and_gradient_come_from_the_expert_of_its_timestep(killed):
    """Each step trains one sampler step of 4 (keyed by the step: here one of the low-noise expert, then two
    of the high-noise one); its policy and reference transitions and its gradient go through the expert of
    that step's sigma. Both experts start as their reference (LoRA B = 0), so a step whose expert no earlier
    step trained has the KL 0 exactly, a later step of a trained expert a KL above 0; the trained step's
    log-probability is the rollout's (which ran every sampler step through its expert): no ratio leaves the
    clip range of 1e-4."""
    from mm_pipelines import FlowGRPO
    from wan22_train.pipeline import Wan22Pipeline

    _, got = killed("grpo")
    assert [r["step"] for r in got] == [1, 2, 3]

    grpo = FlowGRPO(Wan22Pipeline.from_options({"expert": "both"}), sampling_steps=4, timestep_fraction=0.25)
    boundary = grpo.base.boundary_timestep()
    high = []
    for s in range(3):
        (k,) = grpo.train_steps(SampleRNG(seed=SEED, step=s, sample_ids=[0]))
        high.append(float(grpo.sigmas[k]) * 1000 >= boundary)
    first = [high.index(h) == s for s, h in enumerate(high)]
    assert high == [False, True, True], f"pick another seed: experts (high) {high}"
    kls = [r["grpo_kl"] for r in got]
    assert [kl == 0.0 for kl in kls] == first, f"experts (high: True) {high}, KL {kls}"
    assert all(r["grpo_clip_fraction"] == 0.0 and r["reward_std"] > 0 for r in got), got


@pytest.mark.parametrize("mode", ["grpo", "nft", "dpo"])
def test_a_run_sigkilled_mid_run_resumes_with_the_uninterrupted_runs_rewards_and_losses(
    tiny, mode, killed, main_forked, capfd
):
    save, before = killed(mode)
    assert [r["step"] for r in before] == [1, 2, 3]
    capfd.readouterr()
    main_forked(wan22_main, argv(tiny, mode, save), nproc=1)
    assert f"resumed from {save} at iteration 2" in capfd.readouterr().err
    got = records(save)
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))
    assert got[:2] == before[:2]  # the records of the steps before the checkpoint are kept as they were
    for key in MODES[mode][
        2
    ]:  # step 3, trained again from the step-2 checkpoint, as the killed run trained it
        assert got[2][key] == pytest.approx(before[2][key], rel=1e-5, abs=1e-7), f"{mode} {key}"
    assert all(math.isfinite(got[3][key]) for key in MODES[mode][2])
