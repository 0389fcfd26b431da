"""The Wan predictor as the FSDP2 root returns no view tensor (torch's "returned a view tensor" hazard)."""

from __future__ import annotations

import warnings

import torch

CONFIG = dict(
    model_type="t2v", patch_size=(1, 2, 2), in_dim=4, dim=32, ffn_dim=48, freq_dim=32, text_dim=24,
    out_dim=4, num_heads=2, num_layers=2, qk_norm=True, cross_attn_norm=True, eps=1e-6, rope_max_seq_len=64,
)  # fmt: skip


def test_fsdp2_root_forward_returns_no_view_and_warns_nothing(distributed):
    def body(rank, world_size):
        from torch.distributed.fsdp import fully_shard
        from wan22_train.model import WanDiTConfig
        from wan22_train.predictor import WanPredictor

        model = WanPredictor(WanDiTConfig(**CONFIG))
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        inputs = (torch.randn(2, 4, 2, 4, 6), torch.tensor([700.0, 125.0]), torch.randn(2, 5, 24))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            out = model(*inputs)
        return out.requires_grad and out._base is None

    assert distributed(body, 1) == [True]
