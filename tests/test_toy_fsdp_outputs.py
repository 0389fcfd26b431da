"""The toy plugin's predictor as the FSDP2 root returns no view tensor (torch's "returned a view tensor" hazard)."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import torch

PLUGIN_DIR = Path(__file__).parent / "plugins"


def test_fsdp2_root_forward_returns_no_view_and_warns_nothing(distributed):
    def body(rank, world_size):
        from torch.distributed.fsdp import fully_shard

        sys.path.insert(0, str(PLUGIN_DIR))
        from toy_plugin import ToyPredictor

        model = ToyPredictor()
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            out = model(torch.randn(4, 8), torch.rand(4), torch.randn(4, 16))
        return out.requires_grad and out._base is None

    assert distributed(body, 1) == [True]
