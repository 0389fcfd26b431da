"""Resolution of weight source, declared format and conversion dir from a sub-model config."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from mm_checkpoint import CheckpointFormatError, CheckpointSource, resolve_checkpoint_source


def test_checkpoint_path_wins_over_from_pretrained() -> None:
    src = resolve_checkpoint_source({"checkpoint_path": "/ckpt", "from_pretrained": "/hub"})
    assert src == CheckpointSource("/ckpt", "auto", None)


def test_from_pretrained_used_when_no_checkpoint_path() -> None:
    assert resolve_checkpoint_source(
        {"from_pretrained": "/hub", "load_format": "HuggingFace"}
    ) == CheckpointSource("/hub", "hf", None)


def test_the_conversion_cache_is_checkpoint_conversion_dir_only() -> None:
    cfg = {"from_pretrained": "/hub", "checkpoint_path": "/c", "load_format": "dcp"}
    assert resolve_checkpoint_source(cfg) == CheckpointSource("/c", "dcp", None)
    cfg["checkpoint_conversion_dir"] = "/cache"
    assert resolve_checkpoint_source(cfg) == CheckpointSource("/c", "dcp", "/cache")


@pytest.mark.parametrize(
    ("old", "new"),
    [("dcp_cache_dir", "checkpoint_conversion_dir"), ("dcp_conversion_dir", "checkpoint_conversion_dir"),
     ("checkpoint_format", "load_format")],
)  # fmt: skip
def test_a_renamed_key_is_refused_naming_the_new_one(old: str, new: str) -> None:
    with pytest.raises(CheckpointFormatError, match=f"{old} was renamed: set {new} instead"):
        resolve_checkpoint_source({"from_pretrained": "/hub", old: "dcp"})


def test_attribute_config_objects_are_accepted() -> None:
    cfg = SimpleNamespace(checkpoint_path=None, from_pretrained="/hub", load_format="torch_dcp",
                          checkpoint_conversion_dir="/cache")  # fmt: skip
    assert resolve_checkpoint_source(cfg) == CheckpointSource("/hub", "dcp", "/cache")


def test_no_weights_configured_gives_no_path() -> None:
    assert resolve_checkpoint_source({}).path is None
