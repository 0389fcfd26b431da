"""Where an export writes: an empty or export-only folder, replaced whole (no stale shard or index of an
older export survives), never one that overlaps the source or holds anything else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from mm_checkpoint import (
    DistributedCheckpointer,
    ExportDestinationError,
    convert_to_dcp,
    export_checkpoint,
    export_lora,
)
from mm_checkpoint.cli import main
from mm_checkpoint.safetensors_io import SafetensorsReader
from safetensors.torch import save_file
from torch import nn


def _model(fill: float, layers: int) -> nn.Module:
    model = nn.Sequential(*(nn.Linear(16, 16) for _ in range(layers)))
    for p in model.parameters():
        nn.init.constant_(p, fill)
    return model


def _run(tmp_path: Path, name: str, fill: float, layers: int = 4) -> Path:
    DistributedCheckpointer(tmp_path / name).save({"model": _model(fill, layers)}, 1)
    return tmp_path / name


def _read_all(folder: Path) -> dict[str, torch.Tensor]:
    with SafetensorsReader(folder) as reader:  # follows an index when there is one, as loaders do
        return {k: reader.read(k) for k in reader.keys()}


def test_a_re_export_into_a_sharded_export_leaves_only_the_new_files_and_loads_the_new_weights(tmp_path):
    out = tmp_path / "out"
    export_checkpoint(_run(tmp_path, "old", 1.0), out, to="hf", max_shard_size="2KB")
    assert (out / "model.safetensors.index.json").is_file() and len(list(out.glob("model-*"))) > 1
    export_checkpoint(_run(tmp_path, "new", 2.0, layers=2), out, to="hf")
    assert sorted(p.name for p in out.iterdir()) == [".mm_export.json", "model.safetensors"]
    loaded = _read_all(out)
    assert sorted(loaded) == ["0.bias", "0.weight", "1.bias", "1.weight"]
    assert all(torch.equal(t, torch.full_like(t, 2.0)) for t in loaded.values())


def test_a_folder_holding_anything_else_is_refused_and_left_as_it_was(tmp_path):
    out = tmp_path / "model"
    out.mkdir()
    save_file({"w": torch.ones(2)}, str(out / "model.safetensors"))  # e.g. a model folder, not an export
    (out / "notes.txt").write_text("mine")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(
        ExportDestinationError,
        match=r"holds files and no \.mm_export\.json \(not an export\): model.safetensors, notes.txt",
    ):
        export_checkpoint(_run(tmp_path, "run", 1.0), out, to="hf")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "run"]  # no partial export left


def test_an_export_folder_with_a_file_added_since_is_refused(tmp_path):
    run, out = _run(tmp_path, "run", 1.0), tmp_path / "out"
    export_checkpoint(run, out, to="hf")
    (out / "README.md").write_text("my notes")
    with pytest.raises(ExportDestinationError, match="holds files no export wrote: README.md"):
        export_checkpoint(run, out, to="hf")


def test_a_failed_export_leaves_the_older_export_whole(tmp_path):
    run, out = _run(tmp_path, "run", 1.0), tmp_path / "out"
    export_checkpoint(run, out, to="hf")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(Exception, match="no_such_map"):  # noqa: PT011 - any failure inside the writer
        export_checkpoint(run, out, to="hf", model_type="no_such_map")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "run"]


@pytest.mark.parametrize("where", ["same", "inside", "around"])
def test_convert_refuses_a_destination_overlapping_its_source_before_writing_anything(
    where, tmp_path, capsys
):
    src = tmp_path / "model"
    src.mkdir()
    save_file({"w": torch.ones(4)}, str(src / "model.safetensors"))
    before = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    dst = {"same": src, "inside": src / "dcp", "around": tmp_path}[where]
    assert main(["convert", str(src), str(dst), "--to", "dcp"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nothing was written" in err and str(src) in err
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == before


def test_an_export_beside_the_checkpoint_in_its_run_root_is_allowed_but_not_the_run_root(tmp_path):
    run = _run(tmp_path, "run", 1.0)
    export_checkpoint(run, run / "export", to="hf")
    assert (run / "export" / "model.safetensors").is_file()
    with pytest.raises(ExportDestinationError, match="holds its source"):
        export_checkpoint(run, run, to="hf")


def test_a_run_root_exports_the_config_json_of_the_sub_models_recorded_source(tmp_path, capsys):
    source = tmp_path / "pretrained"
    source.mkdir()
    (source / "config.json").write_text(json.dumps({"_class_name": "Toy", "dim": 16}))
    container = nn.Module()
    container.predictor = _model(1.0, 1)
    root = tmp_path / "run"
    info = {"sources": {"predictor": str(source)}}
    DistributedCheckpointer(root).save({"model": container}, 2, submodels=["predictor"], info=info)
    (root / "config.yaml").write_text("training: {}\n")  # the run's own files stay out of the export
    (root / "metrics.jsonl").write_text('{"step": 1}\n')
    out = tmp_path / "out"
    assert main(["convert", str(root), str(out), "--to", "diffusers", "--submodel", "predictor"]) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        ".mm_export.json",
        "config.json",
        "diffusion_pytorch_model.safetensors",
    ]
    assert (out / "config.json").read_text() == (source / "config.json").read_text()


def test_a_peft_lora_export_replaces_its_folder_and_refuses_a_foreign_one(tmp_path):
    q = nn.Module()  # peft's layout: predictor.q.lora_A.default.weight (A: 2 x 6), lora_B (B: 5 x 2)
    q.lora_A = nn.ModuleDict({"default": nn.Linear(6, 2, bias=False)})
    q.lora_B = nn.ModuleDict({"default": nn.Linear(2, 5, bias=False)})
    root = nn.Module()
    root.predictor = nn.Module()
    root.predictor.q = q
    DistributedCheckpointer(tmp_path / "ckpt").save({"model": root}, 1)
    out = tmp_path / "lora"
    export_lora(tmp_path / "ckpt", out, "peft", alpha=2.0, submodule="predictor")
    (out / "stale.safetensors").write_bytes(b"")  # as if left by someone else
    with pytest.raises(ExportDestinationError, match="stale.safetensors"):
        export_lora(tmp_path / "ckpt", out, "peft", alpha=2.0, submodule="predictor")
    (out / "stale.safetensors").unlink()
    export_lora(tmp_path / "ckpt", out, "peft", alpha=4.0, submodule="predictor")
    assert sorted(p.name for p in out.iterdir()) == [".mm_export.json", "pytorch_lora_weights.safetensors"]


def test_convert_to_dcp_into_an_earlier_conversion_replaces_it(tmp_path):
    src = tmp_path / "model"
    src.mkdir()
    save_file({"w": torch.ones(4)}, str(src / "model.safetensors"))
    convert_to_dcp(src, tmp_path / "dcp")
    save_file({"w": torch.full((4,), 3.0)}, str(src / "model.safetensors"))
    convert_to_dcp(src, tmp_path / "dcp")
    assert main(["verify", str(src), str(tmp_path / "dcp")]) == 0
