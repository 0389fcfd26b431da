"""``wan22-train plan`` of a Flow-GRPO run (``model.pipeline.grpo``): the rollout, the rewards and the update
of each micro-step traced on fake tensors as parts of their own (``mm_trainer.planner.rollouts``), a tiny
Wan T2V with a LoRA policy (its reference: the base with the adapters off). Nothing is read: the model and
data paths are placeholders."""

from __future__ import annotations

import pytest
import yaml
from mm_config import load_config
from mm_trainer.planner import render, summarize, trace_run
from mm_trainer.planner.device_specs import device_spec

PREDICTOR = {
    "model_type": "t2v", "num_layers": 1, "dim": 64, "num_heads": 4, "ffn_dim": 128, "in_dim": 4, "out_dim": 4,
    "text_dim": 32, "freq_dim": 32, "patch_size": [1, 2, 2], "eps": 1.0e-6, "text_len": 16, "qk_norm": True,
    "cross_attn_norm": True,
}  # fmt: skip
VAE = {"base_dim": 8, "z_dim": 4, "dim_mult": [1, 2], "num_res_blocks": 1, "temperal_downsample": [True],
       "scale_factor_temporal": 2, "scale_factor_spatial": 2, "latents_mean": [0.0] * 4, "latents_std": [1.0] * 4}  # fmt: skip
UMT5 = {"vocab_size": 64, "d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 1, "num_heads": 4,
        "relative_attention_num_buckets": 8, "tokenizer": "/placeholder/tokenizer", "text_len": 16}  # fmt: skip
LORA = {"target_modules": ["blocks.{*}.self_attn.?", "blocks.{*}.ffn.0"], "rank": 4, "alpha": 4}
GROUP, STEPS, PROMPTS = 8, 3, 2


def config(tmp_path, sampling_steps: int):
    grpo = {
        "group_size": GROUP,
        "sampling_steps": sampling_steps,
        "timestep_fraction": 0.5,
        "kl_weight": 0.04,
    }
    cfg = {
        "parallel": {"fsdp_plan": {"apply_modules": ["predictor.blocks.{*}"], "ignored_modules": ["ae"]}},
        "model": {"container_id": "wan2_2_container", "pipeline": {"task": "t2v", "expert": "all", "grpo": grpo},
                  "models": {
            "ae": {"model_id": "wan_video_vae", "from_pretrained": "/placeholder/vae", "freeze": True, "config": VAE},
            "text_encoder": {"model_id": "umt5", "from_pretrained": "/placeholder/umt5", "freeze": True,
                             "meta_init": True, "config": UMT5},
            "predictor": {"model_id": "wan2_2_predictor", "from_pretrained": "/placeholder/transformer",
                          "meta_init": True, "config": PREDICTOR, "lora": LORA},
        }},
        "data": {"dataset_id": "video_text", "data_path": "/placeholder/metadata.json",
                 "dataset": {"num_frames": 9, "height": 32, "width": 32}},
        "training": {"plugin": ["wan22_train.plugin"], "seed": 1, "micro_batch_size": PROMPTS, "train_iters": 1,
                     "phases": {"grpo": {"submodels": ["predictor"]}},
                     "rewards": [{"id": "colour_target", "options": {"target": [1.0, 0.0, 0.0]}}]},
    }  # fmt: skip
    path = tmp_path / f"grpo_{sampling_steps}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return load_config(str(path), world_size=2, check_paths=False)


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    """The step at 3 sampler steps and at 2 (each trains on 1 of them)."""
    tmp = tmp_path_factory.mktemp("grpo_plans")
    out = {}
    for steps in (STEPS, STEPS - 1):
        run = trace_run(config(tmp, steps), world_size=2, device=device_spec("h100"))
        out[steps] = (run, summarize(run))
    return out


def test_a_grpo_step_plans_its_rollout_rewards_and_update_as_parts_of_the_step(plans):
    run, planned = plans[STEPS]
    stages = [f"micro-step 1/1 (grpo, {stage})" for stage in ("rollout", "rewards", "update")]
    assert stages == [p for p in run.parts if p.startswith("micro-step")]
    assert planned.peak_bytes == max(planned.part_peaks.values())
    assert planned.peak_part in stages
    # the step's time holds the rollout's forwards (sampling_steps of them, without backward) beside the update
    rollout, update = run.parts[stages[0]], run.parts[stages[2]]
    assert rollout.compute_s > 0 and update.compute_s > 0
    assert planned.step_seconds >= rollout.compute_s + update.compute_s
    text = render(planned, run)
    assert (
        f"rollouts: {GROUP} clips x {PROMPTS} prompt(s) = {GROUP * PROMPTS} clips per micro-step" in text
    ), text
    assert "(grpo, rollout)" in text and "decoded by the VAE, scored by colour_target" in text, text


def test_each_sampler_step_adds_one_policy_forward_to_the_rollouts_time_and_none_to_the_updates(plans):
    """3 sampler steps against 2, each training on 1 of them: the rollout's time grows by one forward of the
    predictor over the 16 clips (the sampler's step arithmetic beside it), the update's stays the same."""
    (more, _), (fewer, _) = plans[STEPS], plans[STEPS - 1]
    rollout, update = "micro-step 1/1 (grpo, rollout)", "micro-step 1/1 (grpo, update)"
    added = more.parts[rollout].compute_s - fewer.parts[rollout].compute_s
    forward = fewer.parts[rollout].compute_s / (STEPS - 1)  # over: the part also encodes prompts and clips
    assert 0.5 * forward < added <= 1.05 * forward
    assert more.parts[update].compute_s == pytest.approx(fewer.parts[update].compute_s, rel=1e-6)


def test_the_vae_decodes_the_rollouts_for_a_reward_on_frames_in_the_rewards_part(plans):
    """(Only for one on frames: the scorer's own test, libs/mm-trainer/tests/test_rewards.py.)"""
    run, _ = plans[STEPS]
    assert any(m.calls for m in run.modules if m.path.startswith("ae.vae.decoder")), run.modules
    assert (
        run.parts["micro-step 1/1 (grpo, rewards)"].flops > 0
    )  # the decoder's convolutions (colour_target: none)
