"""Attention backends: registry, LSE against the formula, block backward from global out/LSE."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch
import torch.nn.functional as F
from mm_parallel import attention, available_backends, get_backend, lse_backends


def _qkv(seq: int = 10, dtype: torch.dtype = torch.float64) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(2, seq, 3, 8, generator=gen, dtype=dtype) for _ in range(4)]


def _formula(q, k, v, mask) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: ANN001
    """softmax(q k^T / sqrt(d)) v and logsumexp over keys, in [B, S, H(, D)] layout."""
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.size(-1))
    s = s.masked_fill(~mask, float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), v), s.logsumexp(-1).transpose(1, 2)


def test_cpu_registry_lists_sdpa_cpu_flash_and_math_and_which_return_lse() -> None:
    assert {"sdpa", "cpu_flash", "math"} <= set(available_backends())
    assert {"cpu_flash", "math"} <= set(lse_backends())
    assert "sdpa" not in lse_backends()


@pytest.mark.parametrize("name", ["cpu_flash", "math"])
@pytest.mark.parametrize("causal", [False, True])
def test_lse_backend_returns_output_and_logsumexp_of_the_formula(name: str, causal: bool) -> None:
    q, k, v, _ = _qkv()
    valid = torch.ones(2, 10, dtype=torch.bool)
    valid[1, 6:] = False
    mask = valid[:, None, None, :] & (torch.ones(10, 10, dtype=torch.bool).tril() if causal else True)
    out, lse = get_backend(name).forward(q, k, v, causal=causal, attn_mask=valid[:, None, None, :])
    ref_out, ref_lse = _formula(q, k, v, mask)
    torch.testing.assert_close(out, ref_out, rtol=0, atol=1e-12)
    torch.testing.assert_close(lse, ref_lse, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["cpu_flash", "math"])
def test_block_backward_from_global_out_and_lse_sums_to_full_gradients(name: str) -> None:
    q, k, v, dout = _qkv()
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in leaves)).transpose(1, 2).backward(dout)
    backend = get_backend(name)
    out, lse = backend.forward(q, k, v, causal=False, attn_mask=None)
    dq = torch.zeros_like(q)
    dks, dvs = [], []
    for block in (slice(0, 4), slice(4, 10)):  # two KV blocks, as in one ring pass
        g_q, g_k, g_v = backend.backward(
            dout, q, k[:, block], v[:, block], out, lse, causal=False, attn_mask=None
        )
        dq, dks, dvs = dq + g_q, [*dks, g_k], [*dvs, g_v]
    for got, leaf in zip([dq, torch.cat(dks, 1), torch.cat(dvs, 1)], leaves, strict=True):
        torch.testing.assert_close(got, leaf.grad, rtol=0, atol=1e-12)


def test_math_backend_gives_minus_infinity_lse_and_zero_output_for_rows_without_keys() -> None:
    q, k, v, _ = _qkv()
    none_valid = torch.zeros(2, 1, 1, 10, dtype=torch.bool)
    out, lse = get_backend("math").forward(q, k, v, causal=False, attn_mask=none_valid)
    assert torch.isneginf(lse).all() and not out.any()


def test_attention_with_key_padding_mask_matches_sdpa_with_that_mask() -> None:
    q, k, v, _ = _qkv(dtype=torch.float32)
    valid = torch.arange(10)[None, :] < torch.tensor([[10], [7]])
    expected = F.scaled_dot_product_attention(
        *(t.transpose(1, 2) for t in (q, k, v)), attn_mask=valid[:, None, None, :]
    ).transpose(1, 2)
    torch.testing.assert_close(attention(q, k, v, key_padding_mask=valid), expected)


def test_unknown_backend_names_the_registered_ones() -> None:
    with pytest.raises(KeyError, match="registered: .*sdpa"):
        get_backend("xformers")


@pytest.mark.skipif(importlib.util.find_spec("flash_attn") is not None, reason="flash_attn is installed")
def test_flash_attn_backend_is_unavailable_without_the_package() -> None:
    assert "flash_attn" not in available_backends()
    with pytest.raises(RuntimeError, match=r"not available here \(needs .*'mm-parallel\[flash-attn\]'"):
        get_backend("flash_attn")
