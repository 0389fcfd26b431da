"""The toy plugin's predictor as the FSDP2 root returns no view tensor (torch's "returned a view tensor" hazard)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

PLUGIN_DIR = Path(__file__).parent / "plugins"


def build():
    sys.path.insert(0, str(PLUGIN_DIR))
    from toy_plugin import ToyPredictor

    return ToyPredictor()


def test_fsdp2_root_forward_returns_no_view_and_warns_nothing(fsdp2_root_outputs):
    inputs = (torch.randn(4, 8), torch.rand(4), torch.randn(4, 16))
    assert fsdp2_root_outputs(build, lambda model: model(*inputs)) == [True]
