"""3-D RoPE tables and rotation agree with diffusers' WanRotaryPosEmbed and with the rotation formula."""

from __future__ import annotations

import pytest
import torch
from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed
from wan22_train.model import apply_rope, rope_axis_dims, rope_cos_sin


@pytest.mark.parametrize(("head_dim", "dims"), [(128, (44, 42, 42)), (16, (8, 4, 4)), (64, (24, 20, 20))])
def test_head_split_between_frame_height_width(head_dim, dims):
    assert rope_axis_dims(head_dim) == dims


@pytest.mark.parametrize("head_dim", [16, 128])
def test_tables_equal_diffusers_rope_on_a_non_cubic_grid(head_dim):
    grid = (3, 4, 6)
    reference = WanRotaryPosEmbed(head_dim, (1, 2, 2), max_seq_len=64)
    ref_cos, ref_sin = reference(
        torch.zeros(1, 1, grid[0], 2 * grid[1], 2 * grid[2])
    )  # 1, S, 1, D interleaved
    cos, sin = rope_cos_sin(grid, head_dim, max_seq_len=64)
    assert cos.shape == (72, 1, head_dim // 2)
    assert torch.equal(cos, ref_cos[0, :, :, 0::2]) and torch.equal(sin, ref_sin[0, :, :, 1::2])


def test_rotation_is_the_complex_product_of_channel_pairs():
    x = torch.randn(2, 72, 3, 16, dtype=torch.float64)
    cos, sin = rope_cos_sin((3, 4, 6), 16)
    angle = torch.atan2(sin.double(), cos.double())
    expected = torch.view_as_real(
        torch.view_as_complex(x.unflatten(-1, (-1, 2)).contiguous())
        * torch.polar(torch.ones_like(angle), angle)
    )
    assert torch.allclose(apply_rope(x, cos.double(), sin.double()), expected.flatten(-2), atol=1e-12)


def test_bf16_inputs_and_tables_rotate_in_fp32_and_come_back_bf16():
    # FSDP mixed precision (param_dtype bf16) casts the block inputs, the RoPE tables included, to bf16
    x = torch.randn(2, 72, 3, 16).to(torch.bfloat16)
    cos, sin = rope_cos_sin((3, 4, 6), 16)
    out = apply_rope(x, cos.to(torch.bfloat16), sin.to(torch.bfloat16))
    want = apply_rope(x.float(), cos.to(torch.bfloat16).float(), sin.to(torch.bfloat16).float())
    assert out.dtype == torch.bfloat16 and torch.equal(out, want.to(torch.bfloat16))


def test_grid_beyond_max_seq_len_is_rejected():
    with pytest.raises(ValueError, match="rope_max_seq_len=8"):
        rope_cos_sin((2, 9, 4), 16, max_seq_len=8)


def test_compiled_rope_gives_the_eager_result():
    # inductor has no complex codegen: under torch.compile apply_rope rotates the pairs in real arithmetic
    cos, sin = rope_cos_sin((2, 2, 2), 16)
    x = torch.randn(1, 8, 2, 16)
    compiled = torch.compile(apply_rope, backend="aot_eager", fullgraph=True)
    assert torch.allclose(compiled(x, cos, sin), apply_rope(x, cos, sin), atol=1e-6)
