"""Helpers for mm-config tests: configs are real YAML files written into ``tmp_path``."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from mm_config import ConfigError, TrainConfig, load_config

REPO = Path(__file__).resolve().parents[3]
WAN_CONFIG = REPO / "apps" / "wan22-train" / "configs" / "t2v_a14b_high.yaml"
LTX_CONFIG = REPO / "apps" / "ltx2-train" / "configs" / "t2av.yaml"


@pytest.fixture
def write_config(tmp_path: Path) -> Callable[..., Path]:
    """``write_config(data_or_text, name="config.yaml")`` writes a YAML file and returns its path."""

    def write(data: dict[str, Any] | str, name: str = "config.yaml") -> Path:
        path = tmp_path / name
        path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
        return path

    return write


@pytest.fixture
def load(write_config: Callable[..., Path]) -> Callable[..., TrainConfig]:
    """``load(data, *overrides, world_size=1)``: write ``data`` as YAML and load it through load_config."""

    def _load(data: dict[str, Any] | str, *overrides: str, world_size: int = 1) -> TrainConfig:
        return load_config(write_config(data), list(overrides), world_size=world_size)

    return _load


@pytest.fixture
def load_error(load: Callable[..., TrainConfig]) -> Callable[..., ConfigError]:
    """``load_error(data, *overrides, world_size=1)``: the ConfigError that loading raises."""

    def _load_error(data: dict[str, Any] | str, *overrides: str, world_size: int = 1) -> ConfigError:
        with pytest.raises(ConfigError) as info:
            load(data, *overrides, world_size=world_size)
        return info.value

    return _load_error


def _problem_at(err: ConfigError, path: str) -> str:
    found = [str(p) for p in err.problems if p.path == path]
    assert found, f"no problem at {path!r}; report:\n{err}"
    return found[0]


@pytest.fixture
def problem_at() -> Callable[[ConfigError, str], str]:
    """``problem_at(err, path)``: the rendered problem at YAML ``path`` (fails listing the report if absent)."""
    return _problem_at


_CONTAINER = {
    "model": {
        "container_id": "toy_container",
        "models": {
            "ae": {"model_id": "toy_vae", "freeze": True},
            "text_encoder": {"model_id": "toy_te", "freeze": True, "meta_init": True},
            "predictor": {"model_id": "toy_dit", "meta_init": True, "config": {"num_heads": 8}},
        },
    },
}


@pytest.fixture
def container() -> Callable[..., dict[str, Any]]:
    """``container(**sections)``: a small valid container config (ae, text_encoder frozen; predictor
    trainable with 8 heads) with extra sections merged in."""

    def make(**sections: Any) -> dict[str, Any]:
        data = copy.deepcopy(_CONTAINER)
        data.update(copy.deepcopy(sections))
        return data

    return make


@pytest.fixture
def example_configs() -> dict[str, Path]:
    """The shipped example configs."""
    return {"wan": WAN_CONFIG, "ltx": LTX_CONFIG}
