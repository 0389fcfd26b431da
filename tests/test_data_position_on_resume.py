"""A checkpoint's data position on resume: missing is an error naming what is missing, unless the
config resets it on purpose (training.reset_data_position)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

PLUGIN_DIR = str(Path(__file__).parent / "plugins")
SECTIONS = {"training": {"train_iters": 3, "save_interval": 2, "log_sample_ids": True}}


def train(config: Path, *overrides: str) -> None:
    from mm_config import load_config
    from mm_trainer import Trainer

    Trainer(load_config(config, list(overrides), world_size=1)).train()


@pytest.mark.slow
def test_a_missing_data_state_is_an_error_naming_the_file_unless_reset_on_purpose(toy_yaml, distributed):
    first, second = toy_yaml("first", **SECTIONS), toy_yaml("second", **SECTIONS)
    ckpt = first.parent / "ckpt"

    def body(rank: int, world: int) -> str:
        sys.path.insert(0, PLUGIN_DIR)
        train(first, "training.train_iters=2")
        shutil.rmtree(ckpt / "iter_0000002" / "rank_state")
        try:
            train(second, f"training.load={ckpt}")
        except Exception as err:  # noqa: BLE001 - the message is the result
            refused = f"{type(err).__name__}: {err}"
        else:
            refused = ""
        train(second, f"training.load={ckpt}", "training.reset_data_position=true")
        return refused

    (refused,) = distributed(body, 1)
    assert refused.startswith("CheckpointLoadError") and "rank_state/dp_rank_00000.pt" in refused
    assert "['dataloader'] cannot be restored" in refused
    records = [
        json.loads(line) for line in (second.parent / "ckpt" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in records] == [3]
    assert records[0]["sample_ids"] == [0, 1, 2, 3]  # the data started over, on purpose
