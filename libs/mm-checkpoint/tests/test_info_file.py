"""A corrupt ``mm_checkpoint.json`` is one error naming the file and the field, wherever it is read."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from mm_checkpoint import DistributedCheckpointer, checkpoint_info
from mm_checkpoint.cli import main
from mm_checkpoint.errors import CheckpointFormatError
from torch import nn

CORRUPT = {
    "truncated JSON": ('{"iteration": 1, "world_si', "is not valid JSON"),
    "a JSON list": ("[1, 2]", "holds a list; expected a JSON object"),
    "a negative dp_size": (
        '{"iteration": 1, "world_size": 1, "dp_size": -2}',
        "dp_size is -2; expected an integer >= 1",
    ),
    "dp_size as a string": ('{"iteration": 1, "world_size": 1, "dp_size": "1"}', "dp_size is '1'; expected"),
    "sub-models not a list": (
        '{"iteration": 1, "submodels": "predictor"}',
        "submodels is 'predictor'; expected a list",
    ),
}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    state = {"model": nn.Linear(4, 4), "data": {"position": torch.tensor(3)}}
    DistributedCheckpointer(tmp_path / "ckpt").save(state, iteration=1)
    return tmp_path / "ckpt"


@pytest.mark.parametrize("case", list(CORRUPT))
def test_a_resume_from_a_corrupt_record_names_the_file_and_the_field(case, root):
    text, expected = CORRUPT[case]
    info = root / "iter_0000001" / "mm_checkpoint.json"
    info.write_text(text)
    state = {"model": nn.Linear(4, 4), "data": {"position": torch.tensor(0)}}
    with pytest.raises(CheckpointFormatError, match=str(info)) as err:
        DistributedCheckpointer(root).load(state)
    assert expected in str(err.value)


def test_checkpoint_info_of_a_corrupt_record_names_the_file(root):
    info = root / "iter_0000001" / "mm_checkpoint.json"
    info.write_text('{"iteration": 1')
    with pytest.raises(CheckpointFormatError, match=f"{info} is not valid JSON"):
        checkpoint_info(root)


def test_an_export_of_a_corrupt_record_exits_2_with_one_line_naming_it(root, tmp_path, capsys):
    info = root / "iter_0000001" / "mm_checkpoint.json"
    info.write_text('{"submodels": 3}')
    assert main(["convert", str(root), str(tmp_path / "out"), "--to", "safetensors"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{info}: submodels is 3; expected a list of sub-model names" in err
