"""Wan2.2 Diffusion-DPO's set-up (``model.pipeline.dpo``, ``tiny_dpo.yaml``): a run without a reference, with
a reference that trains, or with distillation too is refused before any weight is read; ``make-pairs``
ranks the tiny clips by the colour reward and holds pairs out."""

from __future__ import annotations

import json

import pytest
import torch
from mm_config import ConfigError, check_config
from mm_data.synthetic import COLOURS
from wan22_train.cli import main as wan22_main
from wan22_train.configs import config_path
from wan22_train.tiny import CLIP, load_clips, make_tiny, tiny_overrides


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("tiny"), num_clips=6)


def _check(tiny, *overrides):
    return check_config(config_path("tiny_dpo.yaml"), [*tiny_overrides(tiny), *overrides], world_size=2,
                        check_paths=False)  # fmt: skip


def test_a_full_weight_policy_without_a_reference_is_refused_naming_the_policy(tiny):
    with pytest.raises(ConfigError) as info:
        _check(tiny, "model.models.predictor.lora=null")
    assert info.value.paths == ["model.models.predictor"], str(info.value)
    assert "Diffusion-DPO needs a reference: add the frozen sub-model `reference`" in str(info.value)


def test_a_full_weight_policy_with_a_frozen_reference_passes_and_a_trained_one_is_refused(tiny):
    reference = f"model.models.reference={{model_id: wan2_2_predictor, from_pretrained: {tiny / 'transformer'}, freeze: true}}"
    _check(tiny, "model.models.predictor.lora=null", reference)
    with pytest.raises(ConfigError) as info:
        _check(tiny, "model.models.predictor.lora=null", reference, "model.models.reference.freeze=false")
    assert "`reference` is Diffusion-DPO's frozen reference: set freeze: true" in str(info.value)


def test_dpo_and_distillation_together_are_refused(tiny):
    with pytest.raises(ConfigError) as info:
        _check(tiny, "model.pipeline.distill={student_steps: 4}")
    assert "model.pipeline.dpo" in info.value.paths and "not with distill" in str(info.value)


def test_make_pairs_prefers_the_clip_nearer_the_target_colour_and_holds_pairs_out(tiny):
    assert wan22_main(["make-pairs", str(tiny), "--target", "1", "0", "0"]) == 0
    rows = json.loads((tiny / "data" / "metadata.json").read_text())
    mean = (load_clips(tiny / "data" / "metadata.json", CLIP) + 1).div(2).mean(dim=(2, 3, 4))
    distance = {row["path"]: float((m - torch.tensor([1.0, 0.0, 0.0])).norm()) for row, m in zip(rows, mean)}
    train, held_out = (json.loads((tiny / "pairs" / f"{n}.json").read_text()) for n in ("train", "held_out"))
    assert train and held_out
    for row in train + held_out:
        preferred, rejected = (
            row["preferred"].removeprefix("../data/"),
            row["rejected"].removeprefix("../data/"),
        )
        assert distance[preferred] < distance[rejected]
        assert not set(row["caption"].split()) & set(COLOURS)  # the prompt names no colour
    pairs = lambda rows: {(r["preferred"], r["rejected"]) for r in rows}  # noqa: E731
    assert not pairs(train) & pairs(held_out)


def test_make_pairs_refuses_a_target_outside_the_unit_range(tiny):
    from mm_trainer.run.user_errors import UsageError

    with pytest.raises(UsageError, match=r"--target \[1.0, 2.0, 0.0\]: each of R G B must lie in \[0, 1\]"):
        wan22_main(["make-pairs", str(tiny), "--target", "1", "2", "0"])


def test_a_dpo_run_plans_with_its_pairs_rejected_clip_in_the_batch(tiny, capsys):
    """``plan`` traces a step of the pipeline: a Diffusion-DPO step needs both members of each pair."""
    assert wan22_main(["plan", "--config", str(config_path("tiny_dpo.yaml")), "--world-size", "2",
                       *tiny_overrides(tiny)]) == 0  # fmt: skip
    assert "step time" in capsys.readouterr().out
