"""The predictor contract is diffusers' WanTransformer3DModel positional order (tiny real config)."""

from __future__ import annotations

import pytest
import torch
from mm_pipelines import FlowMatchScheduler, FlowMatchT2VPipeline, SampleRNG

diffusers = pytest.importorskip("diffusers")


def tiny_wan(in_channels: int, out_channels: int = 4):
    torch.manual_seed(0)
    return diffusers.WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=in_channels,
        out_channels=out_channels, text_dim=8, freq_dim=16, ffn_dim=32, num_layers=1, rope_max_seq_len=32,
    )  # fmt: skip


@pytest.mark.parametrize(("task", "in_channels"), [("t2v", 4), ("i2v", 12), ("ti2v", 4)])
def test_upstream_wan_transformer_trains_through_the_pipeline(
    toys, batch, task: str, in_channels: int
) -> None:
    container = toys.Container()
    container.predictor = tiny_wan(in_channels)
    out = FlowMatchT2VPipeline(FlowMatchScheduler(), task=task)(
        container, rng=SampleRNG.for_batch(2), **batch
    )
    out.loss.backward()
    assert torch.isfinite(out.loss)
    assert container.predictor.patch_embedding.weight.grad is not None
