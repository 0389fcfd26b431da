"""A crafted DCP ``.metadata`` in the save dir runs nothing when the trainer resumes from it."""

from __future__ import annotations

import pickle


def test_resuming_from_a_crafted_metadata_file_runs_nothing_and_names_it(
    distributed, toy_yaml, tmp_path, trainer_build_error, pickle_payload
):
    config = toy_yaml()
    iteration_dir, marker = config.parent / "ckpt" / "iter_0000002", tmp_path / "pwned"
    iteration_dir.mkdir(parents=True)
    (iteration_dir / ".metadata").write_bytes(pickle.dumps({"state_dict_metadata": pickle_payload(marker)}))
    (iteration_dir.parent / "latest_checkpointed_iteration.txt").write_text("2")

    for message in distributed(lambda rank, world: trainer_build_error(config, world), 2):
        assert message.startswith("CheckpointFormatError") and str(iteration_dir / ".metadata") in message
    assert not marker.exists()
