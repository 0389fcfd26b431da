"""Which changed settings a resume refuses and which it applies, and that applied optimizer settings
win over the checkpoint's optimizer and scheduler state."""

from __future__ import annotations

import copy

import pytest
import torch
from mm_trainer.model.optim import build_lr_scheduler
from mm_trainer.run.resume_settings import (
    ResumeSettingsError,
    adapter_layers,
    check_resume,
    compare_settings,
    keep_configured_hyperparameters,
)
from torch import nn

SAVED = {
    "model": {"container_id": "c", "models": {"predictor": {"model_id": "p", "from_pretrained": "/a", "dtype": None,
              "config": {"dim": 8}, "lora": {"target_modules": ["x"], "rank": 2, "alpha": 4.0}}}},
    "training": {"lr": 0.1, "seed": 1, "ema": None, "plugin": ["toy"], "save": "/runs/a"},
    "parallel": {"world_size": 2},
}  # fmt: skip


def _changed(**paths) -> dict:
    """SAVED with the dotted ``paths`` (``__`` for dots) set to new values."""
    data = copy.deepcopy(SAVED)
    for path, value in paths.items():
        *parents, leaf = path.split("__")
        node = data
        for part in parents:
            node = node[part]
        node[leaf] = value
    return data


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("model__models__predictor__config__dim", 16),
        ("model__models__predictor__lora__alpha", 8.0),
        ("model__models__predictor__lora__target_modules", ["y"]),
        ("model__models__predictor__model_id", "q"),
        ("model__container_id", "d"),
        ("training__seed", 2),
        ("training__plugin", ["other"]),
        ("training__ema", {"decay": 0.9}),
    ],
)
def test_a_setting_that_defines_the_checkpoint_is_refused(path, value):
    refused, applied = compare_settings(SAVED, _changed(**{path: value}))
    assert len(refused) == 1 and not applied
    assert refused[0].startswith(path.replace("__", ".").split(".decay")[0])


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("training__lr", 0.01),
        ("training__save", "/runs/b"),
        ("model__models__predictor__from_pretrained", "/moved"),
        ("model__models__predictor__dtype", "bf16"),
        ("parallel__world_size", 4),
    ],
)
def test_a_setting_a_resume_may_change_is_applied_with_old_and_new_values(path, value):
    refused, applied = compare_settings(SAVED, _changed(**{path: value}))
    old = SAVED
    for part in path.split("__"):
        old = old[part]
    assert not refused and applied == [f"{path.replace('__', '.')}: {old!r} -> {value!r}"]


def test_adapter_layers_are_read_from_state_dict_keys():
    keys = ["predictor.blocks.0.fc1.lora_A.default.weight", "predictor.blocks.0.fc1.lora_B.default.weight",
            "model.head.lora_A.default.weight", "predictor.blocks.0.fc1.base_layer.weight"]  # fmt: skip
    assert adapter_layers(keys) == {"predictor": {"blocks.0.fc1"}, "model": {"head"}}


def test_reset_data_position_with_nothing_to_resume_is_refused():
    config = type("C", (), {"training": type("T", (), {"reset_data_position": True})()})()
    with pytest.raises(ResumeSettingsError, match="reset_data_position: true, but this run resumes nothing"):
        check_resume(config, None)


def _optimizer(model: nn.Module, lr: float, weight_decay: float, betas=(0.9, 0.999)):
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, betas=betas)
    return optimizer, build_lr_scheduler(optimizer, kind="cosine", warmup=2, total=10, lr=lr, min_lr=0.0)


def test_the_configured_optimizer_settings_win_over_the_checkpoints_and_the_schedule_position_is_kept():
    torch.manual_seed(0)
    model = nn.Linear(4, 4)
    old_opt, old_sched = _optimizer(model, lr=0.1, weight_decay=0.01)
    for _ in range(3):
        model(torch.randn(2, 4)).sum().backward()
        old_opt.step()
        old_sched.step()
    opt_state, sched_state = old_opt.state_dict(), old_sched.state_dict()

    new_opt, new_sched = _optimizer(model, lr=0.02, weight_decay=0.5, betas=(0.8, 0.99))
    with keep_configured_hyperparameters(new_opt, new_sched):
        new_opt.load_state_dict(opt_state)
        new_sched.load_state_dict(sched_state)
    group = new_opt.param_groups[0]
    assert (group["weight_decay"], group["betas"], group["initial_lr"]) == (0.5, (0.8, 0.99), 0.02)
    assert new_sched.last_epoch == 3 and new_sched.base_lrs == [0.02]
    assert group["lr"] == pytest.approx(
        0.02 * old_opt.param_groups[0]["lr"] / 0.1
    )  # same point of the cosine
    assert torch.equal(new_opt.state[model.weight]["exp_avg"], old_opt.state[model.weight]["exp_avg"])
    new_sched.step()  # and the schedule goes on from the configured lr
    old_sched.step()
    assert group["lr"] == pytest.approx(0.02 * old_opt.param_groups[0]["lr"] / 0.1)
