"""Model-only saves (training.model_save_interval) and retention (keep_last + keep_every) across a resume."""

from __future__ import annotations

from pathlib import Path

from mm_checkpoint import checkpoint_info
from mm_checkpoint.restricted_dcp import read_dcp_metadata


def _train(toy_trainer, config: Path, world_size: int, *overrides: str) -> int:
    trainer = toy_trainer(config, world_size, *overrides)
    try:
        return trainer.train()
    finally:
        trainer.close()


def _iterations(root: Path) -> list[int]:
    return sorted(int(p.name[5:]) for p in root.glob("iter_*"))


def test_retention_and_model_only_saves_keep_exactly_what_the_rule_says_across_a_resume(
    distributed, toy_yaml, toy_trainer
):
    rule = {"save_interval": 1, "model_save_interval": 2, "keep_last": 2, "keep_every": 3}
    config = toy_yaml(training={"train_iters": 4, **rule})
    ckpt = config.parent / "ckpt"
    assert distributed(lambda rank, world: _train(toy_trainer, config, world), 1) == [4]
    assert _iterations(ckpt) == [3, 4] and _iterations(ckpt / "model_only") == [2, 4]

    resumed = distributed(lambda rank, world: _train(toy_trainer, config, world, "training.train_iters=7"), 1)
    assert resumed == [7]
    assert _iterations(ckpt) == [3, 6, 7]  # the last 2, and every multiple of 3
    assert _iterations(ckpt / "model_only") == [4, 6]


def test_a_model_only_checkpoint_holds_the_weights_and_the_run_config_but_no_optimizer(
    distributed, toy_yaml, toy_trainer
):
    config = toy_yaml(training={"train_iters": 2, "save_interval": 2, "model_save_interval": 1, "ema": {}})
    assert distributed(lambda rank, world: _train(toy_trainer, config, world), 1) == [2]
    model_only = config.parent / "ckpt" / "model_only"
    stored = {k.split(".", 1)[0] for k in read_dcp_metadata(model_only / "iter_0000002").state_dict_metadata}
    assert stored == {"model", "ema"}
    assert (model_only / "config.yaml").is_file() and checkpoint_info(model_only)["sources"]
