"""The Wan predictor as the FSDP2 root returns no view tensor (torch's "returned a view tensor" hazard)."""

from __future__ import annotations

import torch

CONFIG = dict(
    model_type="t2v", patch_size=(1, 2, 2), in_dim=4, dim=32, ffn_dim=48, freq_dim=32, text_dim=24,
    out_dim=4, num_heads=2, num_layers=2, qk_norm=True, cross_attn_norm=True, eps=1e-6, rope_max_seq_len=64,
)  # fmt: skip


def build():
    from wan22_train.model import WanDiTConfig
    from wan22_train.predictor import WanPredictor

    return WanPredictor(WanDiTConfig(**CONFIG))


def test_fsdp2_root_forward_returns_no_view_and_warns_nothing(fsdp2_root_outputs):
    inputs = (torch.randn(2, 4, 2, 4, 6), torch.tensor([700.0, 125.0]), torch.randn(2, 5, 24))
    assert fsdp2_root_outputs(build, lambda model: model(*inputs)) == [True]
