"""What a run leaves (metrics records, console lines, a checkpoint naming its sub-models) and --dry-run
on a 10B-parameter config."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

EXPECTED_FIELDS = {
    "step", "loss", "grad_norm", "lr", "step_time_s", "samples_per_s", "tokens_per_s", "peak_memory_bytes",
}  # fmt: skip


@pytest.mark.slow
def test_a_run_without_a_terminal_logs_metrics_plain_lines_and_where_its_files_are(
    toy_yaml, mm_train, metrics_of
):
    """One run (output captured: no terminal, as in a log file) checked for what it leaves its user."""
    config = toy_yaml(
        training={"train_iters": 6, "log_interval": 2, "save_interval": 100, "peak_flops": 1e12}
    )
    proc = mm_train(config)
    save = config.parent / "ckpt"
    _metrics_jsonl_has_one_record_per_log_step_with_every_field(metrics_of(save))
    _console_names_run_directory_checkpoints_and_metrics_at_start_and_end(proc.stdout, save)
    _stderr_has_one_plain_line_per_log_step(proc.stderr)
    _checkpoint_records_the_container_sub_models(save)


def _metrics_jsonl_has_one_record_per_log_step_with_every_field(records: list[dict]) -> None:
    assert [r["step"] for r in records] == [2, 4, 6]
    for r in records:
        assert EXPECTED_FIELDS <= r.keys()
        assert r["tokens_per_s"] > 0 and r["samples_per_s"] > 0
        assert 0 < r["mfu"] < 1  # the plugin reports FLOPs per step; the peak comes from the config


def _console_names_run_directory_checkpoints_and_metrics_at_start_and_end(stdout: str, save: Path) -> None:
    out = stdout.splitlines()
    assert f"mm-train: run directory: {save} (new run, 6 iterations)" in out
    assert f"mm-train: checkpoints:   {save / 'iter_*'} (every 100 steps and at iteration 6)" in out
    assert f"mm-train: run directory: {save} (stopped at iteration 6 of 6)" in out
    assert f"mm-train: last checkpoint: {save / 'iter_0000006'}" in out
    assert out.count(f"mm-train: metrics:       {save / 'metrics.jsonl'}") == 2


def _stderr_has_one_plain_line_per_log_step(stderr: str) -> None:
    steps = [line for line in stderr.splitlines() if line.startswith("step ")]
    assert [line.split(" | ")[0] for line in steps] == ["step 2/6", "step 4/6", "step 6/6"]
    for line in steps:
        assert re.fullmatch(
            r"step \d/6 \| loss \S+ \| lr \S+ \| grad_norm \S+ \| step_time \S+s \| samples/s \S+ \| eta \S+",
            line,
        ), line
    assert "\r" not in stderr  # no progress-bar redraws


def _checkpoint_records_the_container_sub_models(save: Path) -> None:
    info = json.loads((save / "iter_0000006" / "mm_checkpoint.json").read_text())
    assert info["submodels"] == ["predictor"]  # so mm-ckpt converts or exports one only when asked


@pytest.mark.slow
def test_dry_run_of_a_10b_config_prints_units_without_allocating(toy_yaml, mm_train_peak_rss):
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
    out, peak_kib = mm_train_peak_rss(config, "--dry-run", "--world-size", "8")
    assert peak_kib < 1024 * 1024, f"dry run peaked at {peak_kib / 1024:.0f} MiB"
    assert "predictor.blocks.79" in out
    # 80 blocks x 2 x (8192^2 + 8192) fp32 params over 8 ranks
    assert "sharded params per rank, predictor: 5.0 GiB" in out
    # and the full estimate (mm-train plan's one-step trace on fake tensors; h100 by default)
    assert "full estimate (mm-train plan --device h100):" in out and "\n  optimizer states " in out
    assert "features: compile (torch.compile backend=inductor mode=default): 80 module(s)" in out
    assert (
        "features: recompute (selective, every 40 matched): 2 module(s): predictor.blocks.0, predictor.blocks.40"
        in out
    )
