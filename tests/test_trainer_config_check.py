"""The trainer starts with the config check, and ``training.device`` is the device of the whole run."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import pytest
import torch.distributed as dist
from mm_config import ConfigError, load_config

PLUGIN_DIR = str(Path(__file__).parent / "plugins")


@pytest.fixture(autouse=True)
def toy_plugin_importable(monkeypatch):
    monkeypatch.syspath_prepend(PLUGIN_DIR)


def test_trainer_refuses_a_missing_path_before_it_starts_anything(toy_yaml, tmp_path):
    from mm_trainer import Trainer

    gone = tmp_path / "gone"
    path = toy_yaml(model={"models": {"predictor": {"from_pretrained": str(gone)}}})
    config = load_config(path, world_size=1)  # a Python caller that skipped the path check
    with pytest.raises(
        ConfigError, match=rf"model.models.predictor.from_pretrained = '{gone}': path not found"
    ):
        Trainer(config)
    assert not dist.is_initialized()  # refused before the process group, the model and the data


def test_trainer_logs_the_warning_of_a_long_run_that_saves_nothing(toy_yaml, caplog):
    from mm_trainer import preflight

    config = load_config(
        toy_yaml(training={"save": None, "train_iters": 30, "save_interval": 10}), world_size=1
    )
    with caplog.at_level(logging.WARNING, logger="mm_trainer"):
        assert preflight(config) == config
    assert "training.save: null: this run of 30 steps writes no checkpoint" in caplog.text
    assert "and no metrics files" in caplog.text


def test_training_device_is_the_device_of_the_mesh(distributed, toy_yaml):
    config = toy_yaml(training={"device": "cpu"})

    def body(rank, world_size):
        os.environ["MM_PARALLEL_DEVICE"] = "cuda"  # what detection would otherwise pick
        if PLUGIN_DIR not in sys.path:
            sys.path.insert(0, PLUGIN_DIR)
        from mm_trainer import Trainer

        trainer = Trainer(load_config(config, world_size=world_size))
        state = trainer.parallel_state
        return state.device_type, state.world_mesh.device_type, trainer.device.type

    assert distributed(body, 2) == [("cpu", "cpu", "cpu")] * 2
