"""`wan22-train export` of a checkpoint whose DCP `.metadata` was crafted: refused, nothing runs."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
from mm_checkpoint import CheckpointFormatError
from mm_config import dump_config, load_config
from wan22_train.cli import main
from wan22_train.configs import config_path
from wan22_train.tiny import make_tiny, tiny_overrides


def test_export_of_a_crafted_checkpoint_runs_nothing_and_names_the_file(
    tmp_path: Path, pickle_payload
) -> None:
    tiny = make_tiny(tmp_path / "tiny")
    ckpt, marker = tmp_path / "ckpt", tmp_path / "pwned"
    iteration_dir = ckpt / "iter_0000001"
    iteration_dir.mkdir(parents=True)
    dump_config(
        load_config(config_path("tiny_t2v.yaml"), tiny_overrides(tiny), world_size=2), ckpt / "config.yaml"
    )
    (iteration_dir / "mm_checkpoint.json").write_text(json.dumps({"iteration": 1, "world_size": 2}))
    (iteration_dir / ".metadata").write_bytes(pickle.dumps({"state_dict_metadata": pickle_payload(marker)}))
    (ckpt / "latest_checkpointed_iteration.txt").write_text("1")
    with pytest.raises(CheckpointFormatError, match=str(iteration_dir / ".metadata")):
        main(["export", "--checkpoint", str(ckpt), "--out", str(tmp_path / "out")])
    assert not marker.exists()
