"""LTX-2 Flow-GRPO and DiffusionNFT through the trainer (``configs/tiny_t2av_grpo.yaml``, ``tiny_t2av_nft.yaml``:
a LoRA policy on the tiny transformer, video and audio rolled out, the ``colour_target`` reward on the video
decoded by the cache's VAE; the NFT run also the ``tone_target`` reward on the audio, decoded by the cache's
audio VAE and Griffin-Lim): 2 steps at 1 rank log finite rewards and losses and move the adapters; the GRPO
run at 2 ranks with Ulysses 2 logs the 1-rank run's rewards and losses."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

STEPS = 2
TONE = "{id: tone_target, weight: 0.5, options: {frequency: 440}}"  # on the audio: NFT's run scores both
CONFIGS = Path(__file__).resolve().parents[1] / "configs"
README = "apps/ltx2-train/README.md"
#: The README's lines that train each mode (run here on the tests' tiny cache, shortened: see ``run``).
LINES = {
    "grpo": "torchrun --standalone --nproc-per-node 2 -m ltx2_train --config apps/ltx2-train/configs/tiny_t2av_grpo.yaml",
    "nft": "torchrun --standalone --nproc-per-node 2 -m ltx2_train --config apps/ltx2-train/configs/tiny_t2av_nft.yaml",
}
#: Per mode: its config, its smallest rollouts, and the values each step logs.
MODES = {
    "grpo": (
        "tiny_t2av_grpo.yaml",
        ["model.pipeline.grpo.group_size=2", "model.pipeline.grpo.sampling_steps=2"],
        ("loss", "reward", "reward_std", "reward_colour_target", "grpo_kl", "grpo_clip_fraction"),
    ),
    "nft": (
        "tiny_t2av_nft.yaml",
        [
            "model.pipeline.nft.group_size=2",
            "model.pipeline.nft.sampling_steps=2",
            f"training.rewards=[{{id: colour_target, options: {{target: [1, 0, 0]}}}}, {TONE}]",
        ],
        ("loss", "reward", "reward_std", "reward_colour_target", "reward_tone_target", "nft_kl",
         "nft_old_deviation", "nft_old_decay"),
    ),
}  # fmt: skip


def records(log_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (log_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def run(tiny_cache, run_config, ltx2_train, tmp_path_factory, readme):
    """``run(mode, nproc=1, ulysses=1)``: the mode's records of its README line (:data:`LINES`) on the tests'
    tiny cache, shortened to a 2-step run (micro-batches of 2 prompts, 2 clips each on 2 sampler steps, no
    checkpoint) at ``nproc`` ranks with Ulysses ``ulysses``; each layout runs once per module."""
    done: dict[tuple[str, int, int], list[dict]] = {}

    def go(mode: str, nproc: int = 1, ulysses: int = 1) -> list[dict]:
        if (mode, nproc, ulysses) not in done:
            name, overrides, _ = MODES[mode]
            log_dir = tmp_path_factory.mktemp(f"{mode}_{nproc}_{ulysses}")
            config = run_config(tiny_cache, CONFIGS / name, train_iters=STEPS, micro_batch_size=2, save=None,
                                log_dir=str(log_dir), tensorboard=False, deterministic=True)  # fmt: skip
            argv = readme.command(README, LINES[mode], paths={f"apps/ltx2-train/configs/{name}": config},
                                  extra=(*overrides, f"parallel.ulysses_parallel_size={ulysses}"))  # fmt: skip
            ltx2_train(*readme.launched(argv)[2], nproc=nproc)
            done[(mode, nproc, ulysses)] = records(log_dir)
        return done[(mode, nproc, ulysses)]

    return go


def test_the_reward_configs_read_the_tiny_runs_cache():
    # one `preprocess` (of tiny_t2av.yaml, the tests' tiny cache) serves every tiny run of the README
    tiny, *modes = (yaml.safe_load((CONFIGS / name).read_text()) for name in
                    ("tiny_t2av.yaml", *(config for config, _, _ in MODES.values())))  # fmt: skip
    assert all(mode["data"] == tiny["data"] for mode in modes)


@pytest.mark.parametrize("mode", list(MODES))
def test_two_steps_at_one_rank_log_finite_rewards_and_losses_and_move_the_adapters(run, mode):
    """Every step logs the mode's values, finite; the reward is the colour reward's (minus the distance of the
    decoded video's mean colour to red; NFT: plus half the tone reward of the decoded audio, minus its octaves
    from 440 Hz), and differs between the clips. The LoRA policy starts as its reference (B = 0): the KL to it
    is 0 at step 1 and above 0 at step 2, once the adapters moved (DiffusionNFT: the policy also leaves its old
    policy, an EMA behind it)."""
    rows = run(mode)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    for row in rows:
        for key in MODES[mode][2]:
            assert math.isfinite(row[key]), (key, row)
        colour, tone = row["reward_colour_target"], row.get("reward_tone_target", 0.0)
        assert row["reward"] == pytest.approx(colour + 0.5 * tone)
        assert -math.sqrt(3) < colour < 0 and row["reward_std"] > 0 and tone <= 0  # decoded, distinct clips
    kl = f"{mode}_kl"
    assert rows[0][kl] == 0 and rows[1][kl] > 0
    if mode == "nft":
        assert rows[0]["nft_old_deviation"] == 0 and rows[1]["nft_old_deviation"] > 0


@pytest.mark.slow
def test_grpo_at_two_ranks_with_ulysses_logs_the_rewards_and_losses_of_one_rank(run):
    """The rollouts' noise is keyed by sample, group index and stream, never by rank; Ulysses 2 splits each
    forward's video and audio tokens over the ranks: the same rewards, losses and KL at either layout."""
    one, two = run("grpo"), run("grpo", nproc=2, ulysses=2)
    for key in ("loss", "reward", "reward_std", "grpo_kl"):
        assert [r[key] for r in two] == pytest.approx([r[key] for r in one], rel=1e-3, abs=1e-7), key
