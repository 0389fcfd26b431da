"""The README's commands of the training modes beyond plain fine-tuning, as a user types them from
the repository root (each line taken from the README by its text): both experts in one job, DMD2
distillation (train, export the student, sample it on its 4 steps), the two-expert distillation,
Diffusion-DPO (its pairs from make-pairs, then training), Flow-GRPO and DiffusionNFT (the same at 1 rank as at
2 ranks + Ulysses 2).
Shortened as the README says: each training to 2 steps, make-tiny without the VAE fit. What the modes
compute is tested elsewhere (test_wan_both_experts_e2e.py, test_wan_distill_e2e.py,
test_wan_distill_pipeline.py, test_wan_dpo_e2e.py, libs/mm-pipelines/tests/test_flow_grpo.py); here, that the
documented commands run as written."""

from __future__ import annotations

import json
import math

import pytest
from wan22_train.cli import main as wan22_main
from wan22_train.configs import config_path

pytestmark = pytest.mark.slow

WAN_README = "apps/wan22-train/README.md"
CONFIGS = config_path("tiny_t2v.yaml").parent
MAKE_TINY = "wan22-train make-tiny runs/tiny"
BOTH = "torchrun --nproc-per-node 2 -m wan22_train --config apps/wan22-train/configs/tiny_t2v_both.yaml"
DISTILL = "torchrun --nproc-per-node 2 -m wan22_train --config apps/wan22-train/configs/tiny_t2v_distill.yaml"
EXPORT_STUDENT = "wan22-train export --checkpoint runs/tiny/ckpt_distill --out runs/tiny/export/student"
SAMPLE_STUDENT = 'wan22-train sample --checkpoint runs/tiny/ckpt_distill --steps 4 --prompt "a red circle moving up" --out runs/tiny/student.mp4'
MAKE_PAIRS = "wan22-train make-pairs runs/tiny --target 1 0 0"
DPO = "torchrun --nproc-per-node 2 -m wan22_train --config apps/wan22-train/configs/tiny_dpo.yaml"
GRPO = "torchrun --nproc-per-node 2 -m wan22_train --config apps/wan22-train/configs/tiny_grpo.yaml"
DISTILL_BOTH = (
    "torchrun --nproc-per-node 2 -m wan22_train --config apps/wan22-train/configs/tiny_t2v_both_distill.yaml"
)


@pytest.fixture(scope="module")
def session(tmp_path_factory, readme):
    """A working directory holding ``runs/tiny`` from the README's make-tiny."""
    cwd = tmp_path_factory.mktemp("wan_modes")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(cwd)
        assert wan22_main(readme.command(WAN_README, MAKE_TINY, extra=("--vae-fit-steps", "0"))[1:]) == 0
    return cwd


def train(readme, main_forked, line: str, *extra: str, nproc: int = 2) -> None:
    """The README's torchrun ``line``, 2 steps, on 2 forked ranks (the command's code path); ``extra``
    overrides, on ``nproc`` ranks."""
    paths = {"apps/wan22-train/configs": CONFIGS}
    argv = readme.command(WAN_README, line, paths=paths, extra=("training.train_iters=2", *extra))
    module, launched, args = readme.launched(argv)
    assert (module, launched) == ("wan22_train", 2)
    main_forked(wan22_main, args, nproc=nproc)


def saved(folder) -> dict:
    return json.loads((folder / "iter_0000002" / "mm_checkpoint.json").read_text())


def test_both_experts_train_in_one_job_as_the_readme_says(session, readme, main_forked, monkeypatch):
    monkeypatch.chdir(session)
    train(readme, main_forked, BOTH)
    assert {"predictor", "predictor_low"} <= set(saved(session / "runs/tiny/ckpt_both")["submodels"])


def test_the_distillation_trains_exports_its_student_and_samples_it_as_the_readme_says(
    session, readme, main_forked, monkeypatch
):
    monkeypatch.chdir(session)
    train(readme, main_forked, DISTILL)
    assert set(saved(session / "runs/tiny/ckpt_distill")["submodels"]) == {"predictor", "critic"}
    for line in (EXPORT_STUDENT, SAMPLE_STUDENT):
        assert wan22_main(readme.command(WAN_README, line)[1:]) == 0
    assert (session / "runs/tiny/export/student/config.json").is_file()
    assert (session / "runs/tiny/student.mp4").stat().st_size > 0


def test_the_two_expert_distillation_trains_as_the_readme_says(session, readme, main_forked, monkeypatch):
    monkeypatch.chdir(session)
    train(readme, main_forked, DISTILL_BOTH)
    students_and_critics = {"predictor", "critic", "predictor_low", "critic_low"}
    assert set(saved(session / "runs/tiny/ckpt_distill_both")["submodels"]) == students_and_critics


def test_dpo_trains_on_the_pairs_make_pairs_writes_as_the_readme_says(
    session, readme, main_forked, monkeypatch
):
    monkeypatch.chdir(session)
    assert wan22_main(readme.command(WAN_README, MAKE_PAIRS)[1:]) == 0
    train(readme, main_forked, DPO)
    assert set(saved(session / "runs/tiny/ckpt_dpo")["submodels"]) == {"predictor"}
    last = json.loads((session / "runs/tiny/ckpt_dpo/metrics.jsonl").read_text().splitlines()[-1])
    assert {"loss_dpo", "dpo_margin", "dpo_accuracy"} <= set(last)


NFT = "torchrun --nproc-per-node 2 -m wan22_train --config apps/wan22-train/configs/tiny_nft.yaml"
#: Per reward mode: its README line, what it logs per step, its KL key, and how close 1 rank comes to 2 ranks +
#: Ulysses 2. Ulysses sums attention in another order: GRPO's rewards (of clips decoded after 4 SDE steps)
#: agree to ~1e-7 (seen: 2e-8), its loss, a small difference of terms of order 1e-5, to ~1e-7 (seen: 3e-8);
#: NFT's loss is a weighted flow-matching loss of order 1 (seen: within 2.4e-5 of each other over 3 steps).
REWARD_MODES = {
    "grpo": (GRPO, ("loss_grpo", "reward", "reward_std", "reward_colour_target", "grpo_kl", "grpo_clip_fraction"),
             "grpo_kl", ()),
    "nft": (NFT, ("loss_nft", "reward", "reward_std", "reward_colour_target", "nft_kl", "nft_old_deviation"),
            "nft_kl", ("model.pipeline.nft.group_size=2",)),
}  # fmt: skip


@pytest.mark.parametrize("mode", ["grpo", "nft"])
def test_a_reward_mode_logs_finite_losses_and_the_reward_statistics_alike_at_2_ranks_with_ulysses_2_and_1_rank(
    session, readme, main_forked, monkeypatch, mode
):
    """``tiny_grpo.yaml`` / ``tiny_nft.yaml`` as the README runs them (2 ranks + Ulysses 2), and at 1 rank: the
    rollouts' noise is keyed by (step, prompt, group index), so both score the same clips and take the same
    loss (NFT with 2 clips per prompt, for time)."""
    line, logged, kl, extra = REWARD_MODES[mode]
    monkeypatch.chdir(session)
    save = f"runs/tiny/ckpt_{mode}"
    train(readme, main_forked, line, *extra, f"training.save={save}")
    train(
        readme,
        main_forked,
        line,
        *extra,
        "parallel.ulysses_parallel_size=1",
        f"training.save={save}_1",
        nproc=1,
    )
    two, one = ([json.loads(line) for line in (session / name / "metrics.jsonl").read_text().splitlines()]
                for name in (save, f"{save}_1"))  # fmt: skip
    assert [r["step"] for r in two] == [r["step"] for r in one] == [1, 2]
    for record in two:
        assert all(math.isfinite(record[key]) for key in logged), record
        assert -math.sqrt(3) <= record["reward"] <= 0  # minus a distance in the RGB unit cube
        assert record["reward_std"] > 0  # the clips of a prompt differ: the advantages are not all 0
        assert record["reward"] == pytest.approx(record["reward_colour_target"])  # the one reward, weight 1
    assert two[0][kl] == 0  # the policy starts as its reference (LoRA B = 0)
    assert two[1][kl] > 0  # the first update moved the policy away from its reference
    for key in logged:
        for have, want in zip(two, one):
            assert have[key] == pytest.approx(want[key], rel=1e-3, abs=1e-6), key


@pytest.mark.parametrize(("config", "phase"), [("tiny_grpo.yaml", "grpo"), ("tiny_nft.yaml", "nft")])
def test_a_shipped_reward_fine_tuning_config_plans_its_rollout_rewards_and_update(
    session, monkeypatch, capsys, config, phase
):
    """``wan22-train plan`` of ``tiny_grpo.yaml`` / ``tiny_nft.yaml``: the rollouts sampled and scored inside the
    step are traced as parts of the step (their properties: test_wan_plan_grpo.py)."""
    monkeypatch.chdir(session)
    assert wan22_main(["plan", "--config", str(config_path(config)), "--world-size", "2"]) == 0
    out = capsys.readouterr().out
    assert "rollouts: 4 clips x 2 prompt(s) = 8 clips per micro-step" in out, out
    assert f"micro-step 1/1 ({phase}, rollout)" in out and "by stage: rollout" in out, out
