"""A checkpoint of several sub-models (a training run's container, a diffusers pipeline root) is never
converted or exported as one model: without a chosen sub-model the call refuses, listing them and the
known model types."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from mm_checkpoint import ContainerCheckpointError, DistributedCheckpointer, export_checkpoint
from mm_checkpoint.cli import main
from safetensors.torch import load_file
from torch import nn


class _Container(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.predictor = nn.Linear(4, 4)
        self.predictor_low = nn.Linear(4, 4)


@pytest.fixture
def run_ckpt(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    root = tmp_path / "run"
    DistributedCheckpointer(root).save({"model": _Container()}, 5, submodels=("predictor", "predictor_low"))
    return root


def test_the_save_records_the_container_sub_models(run_ckpt: Path) -> None:
    info = json.loads((run_ckpt / "iter_0000005" / "mm_checkpoint.json").read_text())
    assert info["submodels"] == ["predictor", "predictor_low"]


def test_export_without_a_sub_model_lists_them_and_the_known_model_types(
    run_ckpt: Path, tmp_path: Path
) -> None:
    with pytest.raises(ContainerCheckpointError, match=r"\['predictor', 'predictor_low'\].*'wan2_2'"):
        export_checkpoint(run_ckpt, tmp_path / "out", to="hf")
    assert not (tmp_path / "out").exists()


def test_mm_ckpt_convert_of_a_run_without_submodel_exits_2(
    run_ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert main(["convert", str(run_ckpt), str(tmp_path / "out"), "--to", "hf"]) == 2
    err = capsys.readouterr().err
    assert "sub-models ['predictor', 'predictor_low']" in err and "--submodel NAME" in err


def test_mm_ckpt_convert_with_submodel_writes_that_sub_model_alone(run_ckpt: Path, tmp_path: Path) -> None:
    assert (
        main(["convert", str(run_ckpt), str(tmp_path / "out"), "--to", "hf", "--submodel", "predictor_low"])
        == 0
    )
    assert sorted(load_file(str(tmp_path / "out" / "model.safetensors"))) == ["bias", "weight"]


def test_a_diffusers_pipeline_root_lists_its_sub_models(
    wan_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    root = tmp_path / "pipeline"
    root.mkdir()
    (root / "model_index.json").write_text('{"_class_name": "WanPipeline"}')
    (root / "transformer").symlink_to(wan_dir)
    (root / "scheduler").mkdir()
    assert main(["convert", str(root), str(tmp_path / "dcp"), "--to", "dcp"]) == 2
    err = capsys.readouterr().err
    assert "pipeline root with sub-models ['transformer']" in err and "'wan2_2'" in err
