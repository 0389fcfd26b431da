"""Crafted checkpoint files run no code: DCP ``.metadata`` and non-tensor DCP entries are read through
restricted unpickling, and every reader refuses them with an error naming the file."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
from mm_checkpoint import CheckpointFormatError, DistributedCheckpointer, export_checkpoint
from mm_checkpoint.cli import main
from mm_checkpoint.restricted_dcp import load_metadata_file
from torch import nn


def _checkpoint(root: Path) -> Path:
    torch.manual_seed(0)
    DistributedCheckpointer(root).save({"model": nn.Linear(4, 4)}, iteration=1)
    return root / "iter_0000001"


def _plant_metadata_payload(dcp_dir: Path, payload: object) -> Path:
    """Rewrite ``.metadata`` as the real metadata with a code-running object inside it."""
    file = dcp_dir / ".metadata"
    metadata = pickle.loads(file.read_bytes())  # our own, just written: trusted here
    metadata.planner_data = {"x": payload}
    file.write_bytes(pickle.dumps(metadata))
    return file


@pytest.fixture
def crafted(tmp_path: Path, pickle_payload) -> tuple[Path, Path, Path]:
    """``(checkpoint root, crafted .metadata, marker the payload would create)``."""
    root, marker = tmp_path / "ckpt", tmp_path / "pwned"
    metadata = _plant_metadata_payload(_checkpoint(root), pickle_payload(marker))
    return root, metadata, marker


def test_the_payload_would_run_under_plain_unpickling(crafted, tmp_path: Path) -> None:
    _, metadata, marker = crafted
    pickle.loads(metadata.read_bytes()).planner_data["x"].close()  # the file the payload opened
    assert marker.exists()  # so the tests below would see it if anything unpickled without restriction


def test_mm_ckpt_inspect_refuses_a_crafted_metadata_file_and_runs_nothing(crafted, capsys) -> None:
    root, metadata, marker = crafted
    assert main(["inspect", str(root)]) == 2
    err = capsys.readouterr().err
    assert str(metadata) in err and "refusing to unpickle io.open" in err and "Traceback" not in err
    assert not marker.exists()


def test_export_refuses_a_crafted_metadata_file_and_runs_nothing(crafted, tmp_path: Path) -> None:
    root, metadata, marker = crafted
    with pytest.raises(CheckpointFormatError, match=str(metadata)):
        export_checkpoint(root, tmp_path / "out", to="hf")
    assert not marker.exists()


def test_resume_refuses_a_crafted_metadata_file_and_runs_nothing(crafted) -> None:
    root, metadata, marker = crafted
    with pytest.raises(CheckpointFormatError, match=str(metadata)):
        DistributedCheckpointer(root).load({"model": nn.Linear(4, 4)})
    assert not marker.exists()


class _Holder:
    """A per-DCP state entry (like an LR scheduler) whose saved value is ``value``."""

    def __init__(self, value: object) -> None:
        self.value = value

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = state["value"]


def test_resume_refuses_a_crafted_non_tensor_entry_and_runs_nothing(tmp_path: Path, pickle_payload) -> None:
    marker = tmp_path / "pwned"
    state = {"model": nn.Linear(4, 4), "lr_scheduler": _Holder(pickle_payload(marker))}
    DistributedCheckpointer(tmp_path / "ckpt").save(state, iteration=1)
    assert not marker.exists()
    with pytest.raises(CheckpointFormatError, match="'lr_scheduler.value' is not plain data"):
        DistributedCheckpointer(tmp_path / "ckpt").load(
            {"model": nn.Linear(4, 4), "lr_scheduler": _Holder(None)}
        )
    assert not marker.exists()


def test_plain_non_tensor_entries_still_load(tmp_path: Path) -> None:
    value = {"lrs": [0.1, 0.2], "step": 3, "name": "cosine", "pair": (1, 2), "none": None}
    DistributedCheckpointer(tmp_path).save({"model": nn.Linear(4, 4), "lr_scheduler": _Holder(value)}, 1)
    holder = _Holder({"lrs": [0.0, 0.0], "step": 0, "name": "", "pair": (0, 0), "none": None})
    DistributedCheckpointer(tmp_path).load({"model": nn.Linear(4, 4), "lr_scheduler": holder})
    assert holder.value == value


def test_a_storage_entry_pointing_outside_the_checkpoint_is_refused(tmp_path: Path) -> None:
    dcp_dir = _checkpoint(tmp_path / "ckpt")
    file = dcp_dir / ".metadata"
    metadata = pickle.loads(file.read_bytes())
    for info in metadata.storage_data.values():
        info.relative_path = "../../etc/passwd"
    file.write_bytes(pickle.dumps(metadata))
    with pytest.raises(CheckpointFormatError, match=r"points at '\.\./\.\./etc/passwd'"):
        load_metadata_file(file)
