"""Metrics records and --dry-run on a 10B-parameter config."""

from __future__ import annotations

import resource

import pytest

EXPECTED_FIELDS = {
    "step", "loss", "grad_norm", "lr", "step_time_s", "samples_per_s", "tokens_per_s", "peak_memory_bytes",
}  # fmt: skip


@pytest.mark.slow
def test_metrics_jsonl_has_one_record_per_log_step_with_every_field(toy_yaml, mm_train, metrics_of):
    config = toy_yaml(
        training={"train_iters": 6, "log_interval": 2, "save_interval": 100, "peak_flops": 1e12}
    )
    mm_train(config)
    records = metrics_of(config.parent / "ckpt")
    assert [r["step"] for r in records] == [2, 4, 6]
    for r in records:
        assert EXPECTED_FIELDS <= r.keys()
        assert r["tokens_per_s"] > 0 and r["samples_per_s"] > 0
        assert 0 < r["mfu"] < 1  # the plugin reports FLOPs per step; the peak comes from the config


@pytest.mark.slow
def test_dry_run_of_a_10b_config_prints_units_without_allocating(toy_yaml, mm_train):
    # 80 blocks of two 8192x8192 linears: ~10.7e9 parameters, built only on the meta device.
    config = toy_yaml(
        model={
            "models": {"predictor": {"config": {"dim": 8, "hidden": 8192, "cond_dim": 16, "num_blocks": 80}}}
        },
        features={
            "compile": {"apply_modules": ["predictor.blocks.{*}"]},
            "recompute_plan": {"apply_modules": ["predictor.blocks.{*}"], "policy": "selective", "every": 40},
        },
    )
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    out = mm_train(config, "--dry-run", "--world-size", "8").stdout
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    assert peak_kib < 1024 * 1024, f"dry run peaked at {peak_kib / 1024:.0f} MiB"
    assert before <= peak_kib
    assert "predictor.blocks.79" in out
    # 80 blocks x 2 x (8192^2 + 8192) fp32 params over 8 ranks
    assert "sharded params per rank, predictor: 5.0 GiB" in out
    assert "features: compile (torch.compile backend=inductor mode=default): 80 module(s)" in out
    assert (
        "features: recompute (selective, every 40 matched): 2 module(s): predictor.blocks.0, predictor.blocks.40"
        in out
    )
