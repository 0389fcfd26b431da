"""MetricsLogger after a resume: metrics.jsonl holds each step once."""

from __future__ import annotations

import json
from pathlib import Path

from mm_trainer import MetricsLogger


def write_steps(log_dir: Path, steps: range, start_step: int, tag: str) -> None:
    logger = MetricsLogger(total_steps=10, start_step=start_step, log_dir=log_dir)
    for step in steps:
        logger.log(step, {"loss": float(step), "run": tag})
    logger.close()


def test_a_resume_supersedes_the_records_after_its_checkpoint(tmp_path: Path) -> None:
    write_steps(tmp_path, range(1, 8), start_step=0, tag="first")  # killed after step 7
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 8, "loss"')  # a line torn by the kill
    write_steps(tmp_path, range(5, 11), start_step=4, tag="resumed")  # resumed from the step-4 checkpoint
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 11))
    assert [r["run"] for r in records] == ["first"] * 4 + ["resumed"] * 6
