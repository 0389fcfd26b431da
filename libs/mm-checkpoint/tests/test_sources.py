"""Resolution of weight source, declared format and conversion dir from a sub-model config."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from mm_checkpoint import CheckpointSource, resolve_checkpoint_source
from mm_checkpoint.layout import TRACKER_FILENAME


def test_checkpoint_path_wins_over_from_pretrained() -> None:
    src = resolve_checkpoint_source({"checkpoint_path": "/ckpt", "from_pretrained": "/hub"})
    assert src == CheckpointSource("/ckpt", "auto", "/ckpt")


def test_from_pretrained_used_when_no_checkpoint_path() -> None:
    assert resolve_checkpoint_source(
        {"from_pretrained": "/hub", "load_format": "HuggingFace"}
    ) == CheckpointSource("/hub", "hf", None)


def test_conversion_dir_priority() -> None:
    cfg = {
        "from_pretrained": "/hub",
        "checkpoint_path": "/c",
        "dcp_conversion_dir": "/d3",
        "dcp_cache_dir": "/d2",
    }
    assert resolve_checkpoint_source(cfg).conversion_dir == "/d2"
    assert resolve_checkpoint_source({**cfg, "checkpoint_conversion_dir": "/d1"}).conversion_dir == "/d1"
    del cfg["dcp_cache_dir"]
    assert resolve_checkpoint_source(cfg).conversion_dir == "/d3"


def test_attribute_config_objects_are_accepted() -> None:
    cfg = SimpleNamespace(checkpoint_path=None, from_pretrained="/hub", load_format="torch_dcp",
                          checkpoint_conversion_dir="/cache", dcp_cache_dir=None, dcp_conversion_dir=None)  # fmt: skip
    assert resolve_checkpoint_source(cfg) == CheckpointSource("/hub", "dcp", "/cache")


def test_checkpoint_path_serves_as_cache_for_dcp_conversion(tmp_path: Path) -> None:
    cfg = {"from_pretrained": "/hub", "checkpoint_path": str(tmp_path), "load_format": "dcp"}
    assert resolve_checkpoint_source(cfg) == CheckpointSource("/hub", "dcp", str(tmp_path))
    (tmp_path / TRACKER_FILENAME).write_text("0\n")  # once converted, the cache is the source
    assert resolve_checkpoint_source(cfg).path == str(tmp_path)


def test_no_weights_configured_gives_no_path() -> None:
    assert resolve_checkpoint_source({}).path is None
