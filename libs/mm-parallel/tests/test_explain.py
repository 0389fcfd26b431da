"""explain_fsdp_plan and the ``mm-parallel explain`` CLI (meta models, no process group)."""

from __future__ import annotations

import json
import math

import torch
from mm_parallel import FSDPPlan, explain_fsdp_plan
from mm_parallel.cli import main


def _meta_container(toy):
    with torch.device("meta"):
        return toy.make_container()


def test_units_with_bytes_per_rank_under_the_plan_dtypes(toy) -> None:
    model = _meta_container(toy)
    plan = FSDPPlan.from_dict(toy.plan(param_dtype="bf16", sub_plans={"text_encoder": {"shard_size": 2}}))
    result = explain_fsdp_plan(model, plan, world_size=4)

    rows = {u.path: u for u in result.units}
    assert list(rows) == [
        "text_encoder",
        "predictor.blocks.0",
        "predictor.blocks.1",
        "predictor.blocks.2",
        "predictor.head",
        "predictor",
    ]
    block = rows["predictor.blocks.0"]
    block_params = list(model.predictor.blocks[0].parameters())
    assert block.numel == sum(p.numel() for p in block_params)
    # fp32 shards, dim 0 split 4 ways (ceil for uneven rows); bf16 when gathered
    assert block.sharded_bytes == sum(
        math.ceil(p.shape[0] / 4) * math.prod(p.shape[1:]) * 4 for p in block_params
    )
    assert block.unsharded_bytes == block.numel * 2
    assert rows["text_encoder"].shard_size == 2
    assert (
        rows["text_encoder"].sharded_bytes == sum(p.numel() for p in model.text_encoder.parameters()) * 4 // 2
    )
    assert result.ignored_bytes == sum(p.numel() * 4 for p in model.ae.parameters())
    largest_two = sorted((u.unsharded_bytes for u in result.units), reverse=True)[:2]
    assert result.peak_param_bytes == sum(u.sharded_bytes for u in result.units) + result.ignored_bytes + sum(
        largest_two
    )


def test_unmatched_patterns_are_listed_not_raised(toy) -> None:
    plan = FSDPPlan.from_dict(toy.plan(apply_modules=["predictor.blocks.{*}", "predictor.final_norm"]))
    result = explain_fsdp_plan(_meta_container(toy), plan, world_size=8)
    assert result.unmatched_patterns == ["predictor.final_norm"]
    assert "unmatched patterns: predictor.final_norm" in str(result)


def test_table_lists_every_unit_and_the_peak(toy) -> None:
    text = explain_fsdp_plan(_meta_container(toy), FSDPPlan.from_dict(toy.plan()), world_size=2).table()
    lines = text.splitlines()
    assert lines[0].split() == [
        "unit",
        "owner",
        "kind",
        "shard",
        "params",
        "numel",
        "per",
        "rank",
        "gathered",
    ]
    block = next(line for line in lines if line.startswith("predictor.blocks.2 "))
    # 368 fp32 elements split 2 ways (dim 0 of every parameter is even), gathered whole
    assert block.split()[-5:] == ["368", "736", "B", "1.4", "KiB"]
    assert "ignored params: 2" in text
    assert "estimated peak parameter memory per rank" in text


def test_cli_explains_a_model_factory_and_a_config_file(tmp_path, monkeypatch, capsys) -> None:
    (tmp_path / "tiny_models.py").write_text(
        "from torch import nn\ndef build():\n    return nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"parallel": {"fsdp_plan": {"apply_modules": ["{*}"]}}}))
    assert main(["explain", "--model", "tiny_models:build", "--plan", str(config), "--world-size", "4"]) == 0
    out = capsys.readouterr().out
    assert [line.split()[0] for line in out.splitlines()[2:5]] == ["0", "1", "<root>"]
    assert "world size: 4" in out
