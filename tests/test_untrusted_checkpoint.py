"""A crafted DCP ``.metadata`` in the save dir runs nothing when the trainer resumes from it."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

PLUGIN_DIR = str(Path(__file__).parent / "plugins")


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_resuming_from_a_crafted_metadata_file_runs_nothing_and_names_it(distributed, toy_yaml, tmp_path):
    config = toy_yaml()
    iteration_dir, marker = config.parent / "ckpt" / "iter_0000002", tmp_path / "pwned"
    iteration_dir.mkdir(parents=True)
    (iteration_dir / ".metadata").write_bytes(pickle.dumps({"state_dict_metadata": _Payload(marker)}))
    (iteration_dir.parent / "latest_checkpointed_iteration.txt").write_text("2")

    def body(rank, world_size):
        if PLUGIN_DIR not in sys.path:
            sys.path.insert(0, PLUGIN_DIR)
        from mm_config import load_config
        from mm_trainer import Trainer

        try:
            Trainer(load_config(config, world_size=world_size))
        except Exception as exc:  # noqa: BLE001
            return f"{type(exc).__name__}: {exc}"
        return "no error"

    for message in distributed(body, 2):
        assert message.startswith("CheckpointFormatError") and str(iteration_dir / ".metadata") in message
    assert not marker.exists()
