"""``training.wandb`` on a real run: a toy run on 2 ranks logs, from rank 0 alone, one offline W&B run whose
history holds every ``metrics.jsonl`` record's loss and learning rate at its step, and the run's config."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("wandb")
pytestmark = pytest.mark.slow


def wandb_records(run_file: Path) -> list[dict]:
    """Every record of a ``.wandb`` file, as wandb's own reader (``wandb leet inspect``) prints them."""
    out = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(run_file)],
                         capture_output=True, text=True, check=True, timeout=120)  # fmt: skip
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def test_a_two_rank_run_logs_its_metrics_records_to_one_offline_wandb_run(
    toy_yaml, mm_train, metrics_of, monkeypatch
):
    monkeypatch.setenv("WANDB_MODE", "offline")  # the mm-train processes inherit it
    config = toy_yaml(training={"train_iters": 4, "save_interval": 100, "wandb": {"project": "toy"}})
    mm_train(config, nproc=2)
    save = config.parent / "ckpt"
    [run_file] = (save / "wandb").glob("offline-run-*/run-*.wandb")  # rank 0's run, and only it
    records = wandb_records(run_file)
    history = {r["history"]["step"]["num"]: r["history"]["item"] for r in records if r["type"] == "history"}
    jsonl = metrics_of(save)
    assert sorted(history) == [r["step"] for r in jsonl] == [1, 2, 3, 4]
    for record in jsonl:
        assert history[record["step"]]["train/loss"] == record["loss"]
        assert history[record["step"]]["train/lr"] == record["lr"]
    run = next(r["run"] for r in records if r["type"] == "run")
    assert run["project"] == "toy" and run["config"]["update"]["training"]["seed"] == 7
