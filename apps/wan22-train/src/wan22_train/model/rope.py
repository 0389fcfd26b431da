"""Wan 3-D rotary position embedding with real-valued cos/sin tables.

The head is split into a frame, a height and a width part (height = width = 2 * (head_dim // 6) channels,
frame gets the rest); each part rotates its channel pairs (2j, 2j+1) by position * theta^(-2j/part).
The tables are built once per forward for the latent grid and shared by every block.
"""

from __future__ import annotations

import torch


def rope_axis_dims(head_dim: int) -> tuple[int, int, int]:
    """Channels of one head given to the (frame, height, width) rotations."""
    hw = 2 * (head_dim // 6)
    return head_dim - 2 * hw, hw, hw


def _axis_angles(positions: int, dims: int, theta: float) -> torch.Tensor:
    # angles: positions, dims // 2 (float64 like the reference, rounded to float32 after cos/sin)
    inv_freq = 1.0 / theta ** (torch.arange(0, dims, 2, dtype=torch.float64) / dims)
    return torch.outer(torch.arange(positions, dtype=torch.float64), inv_freq)


def rope_cos_sin(
    grid: tuple[int, int, int],
    head_dim: int,
    *,
    theta: float = 10000.0,
    max_seq_len: int = 1024,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables for a post-patch latent grid flattened frame-major (f, h, w).

    Args:
        grid: post-patch (frames, height, width).
        head_dim: channels per attention head (even).
        theta: RoPE base.
        max_seq_len: the largest supported position along any axis (diffusers' `rope_max_seq_len`).
        device: where the tables live.

    Returns:
        (cos, sin), each float32 of shape [f * h * w, 1, head_dim // 2] (the 1 broadcasts over heads).
    """
    if max(grid) > max_seq_len:
        raise ValueError(f"latent grid {grid} exceeds rope_max_seq_len={max_seq_len} positions along an axis")
    f, h, w = grid
    cos_parts, sin_parts = [], []
    for axis, (size, dims) in enumerate(zip(grid, rope_axis_dims(head_dim))):
        # per-axis tables are tiny: compute in float64 on the host, expand on the device
        angles = _axis_angles(size, dims, theta)
        shape = [1, 1, 1, dims // 2]
        shape[axis] = size
        for parts, fn in ((cos_parts, torch.cos), (sin_parts, torch.sin)):
            table = fn(angles).to(device=device, dtype=torch.float32)
            parts.append(table.view(shape).expand(f, h, w, dims // 2))
    cos = torch.cat(cos_parts, dim=-1).reshape(f * h * w, 1, head_dim // 2)
    sin = torch.cat(sin_parts, dim=-1).reshape(f * h * w, 1, head_dim // 2)
    return cos, sin


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate channel pairs (2j, 2j+1) of `x` [B, S, H, D] by the tables [S, 1, D // 2]; keeps x's dtype.

    One complex multiply (x_2j + i x_2j+1) * (cos + i sin) in the promoted dtype of x and the
    tables, at least fp32 (complex bf16 does not exist; FSDP's mixed precision casts the tables to
    bf16 with the block inputs): the same arithmetic as the real-valued form, in one pass forward
    and backward instead of six. Under torch.compile the real-valued form: inductor generates no code
    for complex operators (it falls back to eager kernels and warns) and fuses the real form into one
    kernel anyway.
    """
    dtype = torch.promote_types(torch.promote_types(x.dtype, cos.dtype), torch.float32)
    if torch.compiler.is_compiling():
        real, imag = x.to(dtype).unflatten(-1, (-1, 2)).unbind(-1)
        cos, sin = cos.to(dtype), sin.to(dtype)
        rotated = torch.stack((real * cos - imag * sin, real * sin + imag * cos), dim=-1)
        return rotated.flatten(-2).to(x.dtype)
    pairs = torch.view_as_complex(x.to(dtype).unflatten(-1, (-1, 2)).contiguous())
    rotated = torch.view_as_real(pairs * torch.complex(cos.to(dtype), sin.to(dtype)))
    return rotated.flatten(-2).to(x.dtype)
