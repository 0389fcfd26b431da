"""``training.tensorboard``: unset means on when the tensorboard package is installed."""

from __future__ import annotations

import importlib.util
import sys

import pytest
from mm_trainer import MetricsLogger


def _log_one_step(log_dir, **kwargs) -> None:
    logger = MetricsLogger(total_steps=1, log_dir=log_dir, **kwargs)
    logger.log(1, {"loss": 1.0})
    logger.close()


def _without_tensorboard(monkeypatch) -> None:
    for name in [
        m for m in sys.modules if m.split(".")[0] == "tensorboard" or m.startswith("torch.utils.tensorboard")
    ]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if not installed


def test_unset_writes_events_when_the_package_is_installed(tmp_path):
    assert importlib.util.find_spec("tensorboard") is not None  # the dev environment installs it
    _log_one_step(tmp_path)
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def test_false_writes_no_events(tmp_path):
    _log_one_step(tmp_path, tensorboard=False)
    assert (tmp_path / "metrics.jsonl").is_file() and not (tmp_path / "tensorboard").exists()


def test_unset_without_the_package_writes_metrics_only(tmp_path, monkeypatch):
    _without_tensorboard(monkeypatch)
    _log_one_step(tmp_path)
    assert (tmp_path / "metrics.jsonl").is_file() and not (tmp_path / "tensorboard").exists()


def test_true_without_the_package_is_an_error_naming_the_extra(tmp_path, monkeypatch):
    _without_tensorboard(monkeypatch)
    with pytest.raises(
        ImportError, match=r"training.tensorboard is on .*pip install 'mm-trainer\[tensorboard\]'"
    ):
        _log_one_step(tmp_path, tensorboard=True)
