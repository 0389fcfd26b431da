"""``wan22-train plan`` of a packed run (``data.packing``): the worst-case packed micro-batches of the token
budget traced on fake tensors (``mm_trainer.planner.packing``), a tiny Wan T2V on three bucket shapes (one
of them one-frame images). Nothing is read: the model and data paths are placeholders."""

from __future__ import annotations

import pytest
import yaml
from mm_config import load_config
from mm_trainer.planner import render, summarize, trace_run
from mm_trainer.planner.cli import header, plan_numbers
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
BUCKETS = [[32, 32, 1], [32, 48, 9], [48, 32, 5]]
"""Tokens (VAE 2 x 2 x 2, patch 1 x 2 x 2): 64 (an image), 480 (the largest clip), 288."""
LARGEST = 480


def config(tmp_path, budget: int | None):
    cfg = {
        "parallel": {"fsdp_plan": {"apply_modules": ["predictor.blocks.{*}"], "ignored_modules": ["ae"]}},
        "model": {"container_id": "wan2_2_container", "pipeline": {"task": "t2v", "expert": "all"}, "models": {
            "ae": {"model_id": "wan_video_vae", "from_pretrained": "/placeholder/vae", "freeze": True, "config": VAE},
            "text_encoder": {"model_id": "umt5", "from_pretrained": "/placeholder/umt5", "freeze": True,
                             "meta_init": True, "config": UMT5},
            "predictor": {"model_id": "wan2_2_predictor", "meta_init": True, "config": PREDICTOR},
        }},
        "data": {"dataset_id": "video_text", "data_path": "/placeholder/metadata.json",
                 "dataset": {"num_frames": 9, "height": 32, "width": 32, "buckets": BUCKETS}},
        "training": {"plugin": ["wan22_train.plugin"], "seed": 1, "global_batch_size": 4, "micro_batch_size": 2,
                     "train_iters": 1},
    }  # fmt: skip
    if budget is not None:
        cfg["data"]["packing"] = {"token_budget": budget}
    path = tmp_path / f"packed_{budget}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return load_config(str(path), world_size=2, check_paths=False)


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    """Unpacked (2 clips of the largest bucket per micro-batch) and packed at 2 and 4 largest clips' tokens."""
    tmp = tmp_path_factory.mktemp("plans")
    out = {}
    for budget in (None, 2 * LARGEST, 4 * LARGEST):
        run = trace_run(config(tmp, budget), world_size=2, device=device_spec("cpu"))
        out[budget] = (run, summarize(run))
    return out


def test_the_planned_peak_of_a_packed_run_grows_with_its_token_budget(plans):
    (small, planned_small), (large, planned_large) = plans[2 * LARGEST], plans[4 * LARGEST]
    assert [p.tokens for p in large.packs][0] > [p.tokens for p in small.packs][0]
    assert planned_large.peak_bytes > 1.3 * planned_small.peak_bytes


def test_a_packed_plan_traces_the_unpacked_clips_packed_and_the_most_samples_beside_them(plans):
    """At a budget of two largest clips the ``largest`` packed micro-batch holds the unpacked micro-batch's
    clips, as one sequence with a time modulation per token (the unpacked one: per sample), so it costs
    more; the ``smallest`` one (3 samples: the step's 4 over 2 ranks, at least one each) is traced too,
    and the plan is the larger of the two."""
    unpacked, planned_unpacked = plans[None]
    run, planned = plans[2 * LARGEST]
    largest, smallest = run.packs
    assert largest.describe() == "2 x 9x32x48: 960 of 960 tokens" and not unpacked.packs
    assert smallest.samples == 3 and smallest.tokens < largest.tokens
    assert planned.part_peaks["micro-step 1/1"] > planned_unpacked.part_peaks["micro-step 1/1"]
    assert planned.peak_bytes == max(planned.part_peaks.values())
    assert "smallest samples: micro-step 1/1" in planned.part_peaks
    text = "\n".join([header("run.yaml", run), render(planned, run)])
    assert "packed micro-batches of up to 960 tokens x 1 accumulation" in text, text
    assert "packed micro-batches (data.packing.token_budget=960)" in text
    assert "largest  2 x 9x32x48: 960 of 960 tokens" in text, text
    assert [p["kind"] for p in plan_numbers(run)["packs"]] == ["largest", "smallest"]
