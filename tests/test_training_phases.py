"""``training.phases`` on the toy plugin: each phase updates at its cadence with its own optimizer and
schedule, and a run resumed at another layout continues with every phase's uninterrupted losses."""

from __future__ import annotations

import pytest
import torch
import yaml
from mm_config import TrainConfig
from pydantic import ValidationError

pytestmark = pytest.mark.slow

CRITIC = {
    "model_id": "toy_predictor",
    "meta_init": True,
    "config": {"dim": 8, "hidden": 32, "cond_dim": 16, "num_blocks": 3},
}
SECTIONS = {
    "model": {"container_id": "toy_phased_container", "models": {"critic": CRITIC}},
    "training": {
        "global_batch_size": 8,
        "micro_batch_size": 2,
        "gradient_accumulation_steps": None,
        "train_iters": 6,
        "save_interval": 3,
        "log_sample_ids": True,
        "phases": {
            "fit": {"submodels": ["predictor"], "every": 2, "lr": 3e-3},
            "follow": {"submodels": ["critic"], "lr": 1e-2, "lr_warmup_iters": 4, "adam_beta1": 0.0},
        },
    },
    "data": {"dataset": {"num_samples": 24}},
}


def _sections(toy_yaml, name: str):
    """The toy config with a ``critic`` that starts from the predictor's weights (the same at any layout)."""
    path = toy_yaml(name, **SECTIONS)
    cfg = yaml.safe_load(path.read_text())
    models = cfg["model"]["models"]
    models["critic"]["from_pretrained"] = models["predictor"]["from_pretrained"]
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def test_each_phase_updates_at_its_cadence_with_its_own_schedule(toy_yaml, mm_train_forked):
    records = mm_train_forked(_sections(toy_yaml, "cadence"))
    assert [r["step"] for r in records] == list(range(1, 7))
    fit_steps = [r["step"] for r in records if "loss_fit" in r]
    assert fit_steps == [1, 3, 5]  # every: 2 -> optimizer steps 0, 2, 4
    assert all("loss_follow" in r for r in records)
    assert [r["step"] for r in records if "lr_fit" in r] == fit_steps  # logged where it updated, as its loss
    assert all(r["lr_fit"] == pytest.approx(3e-3) for r in records if "lr_fit" in r)  # constant (training's)
    follow_lrs = [r["lr_follow"] for r in records]  # the rate each update used: its own warmup over 4 updates
    assert follow_lrs == pytest.approx([2.5e-3, 5e-3, 7.5e-3, 1e-2, 1e-2, 1e-2])
    assert [r["lr"] for r in records] == follow_lrs  # the first phase that updates at every step


def test_a_phased_run_resumed_at_another_layout_continues_with_the_uninterrupted_losses(
    toy_yaml, mm_train_forked
):
    expected = mm_train_forked(_sections(toy_yaml, "reference"), nproc=2)
    first = _sections(toy_yaml, "first")
    # the checkpoint resumed from is written in the background (training.async_save): every phase's state
    records = mm_train_forked(first, "training.train_iters=3", "training.async_save=true", nproc=2)
    second = _sections(toy_yaml, "second")
    records += mm_train_forked(second, f"training.load={first.parent / 'ckpt'}")  # 2 ranks -> 1
    assert [r["step"] for r in records] == list(range(1, 7))
    assert [r["sample_ids"] for r in records] == [
        r["sample_ids"] for r in expected
    ]  # the same global batches
    for key in ("loss_fit", "loss_follow"):
        got = [r.get(key, float("nan")) for r in records]
        want = [r.get(key, float("nan")) for r in expected]
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-4, atol=0, equal_nan=True)


def test_a_trainable_sub_model_outside_every_phase_is_refused(toy_yaml):
    cfg = yaml.safe_load(_sections(toy_yaml, "refused").read_text())
    del cfg["training"]["phases"]["follow"]
    with pytest.raises(
        ValidationError, match=r"training.phases: the trainable sub-models \['critic'\] belong to no phase"
    ):
        TrainConfig.model_validate(cfg, context={"world_size": 1})
