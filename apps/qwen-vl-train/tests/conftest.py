"""A tiny Qwen2.5-VL folder + ShareGPT data (``make-tiny``) once per session, and builders over it."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[3]
TINY_CONFIG = REPO / "apps" / "qwen-vl-train" / "configs" / "tiny_sft.yaml"


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory) -> Path:
    """``make_tiny`` output: ``model/`` (weights, tokenizer, image processor) and ``data/``."""
    from qwen_vl_train.tiny import make_tiny

    return make_tiny(tmp_path_factory.mktemp("qwen_vl_tiny"))


def model_args(root: Path, **overrides) -> SimpleNamespace:
    """A ``model`` section (single-model form) for the tiny folder."""
    base = dict(model_id="qwen2_5_vl", from_pretrained=str(root / "model"), checkpoint_path=None, meta_init=False,
                dtype=None, config={}, load_format="auto", weight_transform=None,
                checkpoint_conversion_dir=None)  # fmt: skip
    return SimpleNamespace(**{**base, **overrides})


@pytest.fixture
def section():
    """``model_args`` as a fixture."""
    return model_args


@pytest.fixture
def tiny_dataset(tiny_root):
    """Factory ``(rows=None, **data.dataset options) -> ConversationDataset`` (rows: written as JSON)."""
    import qwen_vl_train.plugin  # noqa: F401
    from mm_trainer import conversation_dataset

    def make(rows: list | None = None, **options):
        path = tiny_root / "data" / "sharegpt.json"
        if rows is not None:
            path = tiny_root / "data" / f"rows_{len(list(path.parent.glob('rows_*.json')))}.json"
            path.write_text(json.dumps(rows))
        defaults = dict(processor=str(tiny_root / "model"), mm_plugin="qwen2_vl", video_fps=4.0,
                        video_max_pixels=32 * 32, image_max_pixels=64 * 64)  # fmt: skip
        return conversation_dataset(data_path=str(path), **{**defaults, **options})

    return make


@pytest.fixture
def tiny_model(tiny_root):
    """Factory ``(**model overrides) -> Qwen2_5_VLForTraining`` loaded from the tiny folder."""
    import qwen_vl_train.plugin  # noqa: F401
    from mm_trainer import ModelHub

    return lambda **overrides: ModelHub.build(model_args(tiny_root, **overrides))
