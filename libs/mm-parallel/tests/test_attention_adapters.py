"""The NPU and flash_attn adapters' argument building, against STAND-IN modules (not the real packages).

Neither ``torch_npu`` nor ``flash_attn`` runs here, so each test registers, for its own duration
only, a stand-in module under the real name that computes what the package documents on CPU
float64 tensors and records how it was called:

- ``torch_npu`` stand-in: ``npu_fusion_attention`` / ``npu_fusion_attention_grad`` with layout
  ``BSND``, ``atten_mask`` True = masked out, ``scale`` defaulting to 1, ``sparse_mode=2`` =
  left-up causal from the compressed 2048 x 2048 mask, and ``softmax_max`` / ``softmax_sum``
  ``[B, N, Sq, 8]`` (the row max and the row sum of ``exp(s - max)``, repeated 8 times); the grad
  rebuilds the probabilities as ``exp(s - softmax_max) / softmax_sum``.
- ``flash_attn`` stand-in (2.7 signatures): ``flash_attn_func(..., return_attn_probs=True)`` returns
  ``(out, lse [B, H, Sq], probs)``; ``flash_attn_interface._flash_attn_backward`` writes dq, dk, dv.

A wrong layout, mask polarity, scale or LSE formula in the adapters gives wrong numbers here.
"""

from __future__ import annotations

import importlib.machinery
import math
import sys
import types

import pytest
import torch
import torch.nn.functional as F
from mm_parallel import get_backend

B, S, H, D = 2, 10, 3, 8


def _module(name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    return module


def _qkv() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(B, S, H, D, generator=gen, dtype=torch.float64) for _ in range(4)]


def _keep(causal: bool, padded: bool) -> torch.Tensor:
    """``[B, 1, S, S]`` True = attend: batch 1 has 4 padded keys."""
    valid = torch.ones(B, S, dtype=torch.bool)
    if padded:
        valid[1, 6:] = False
    keep = valid[:, None, None, :].expand(B, 1, S, S)
    return keep & torch.ones(S, S, dtype=torch.bool).tril() if causal else keep


def _formula(q, k, v, keep) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: ANN001
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(D)
    s = s.masked_fill(~keep, float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), v), s.logsumexp(-1).transpose(1, 2)


# ---------------------------------------------------------------- torch_npu stand-in


def _npu_scores(query, key, head_num, input_layout, atten_mask, scale, sparse_mode) -> torch.Tensor:  # noqa: ANN001
    assert input_layout == "BSND" and head_num == query.size(2)
    s = torch.einsum("bqhd,bkhd->bhqk", query, key) * scale
    if sparse_mode == 2:  # left-up causal; the mask is the compressed 2048 x 2048 one
        assert tuple(atten_mask.shape) == (2048, 2048) and atten_mask.dtype == torch.bool
        masked = torch.ones(s.shape[-2:], dtype=torch.bool).triu(1)
    else:
        assert sparse_mode == 0
        masked = atten_mask
    return s if masked is None else s.masked_fill(masked, float("-inf"))


#: Keyword arguments torch_npu documents for the forward and the grad (anything else is an error).
FWD_KEYWORDS = {
    "pse", "padding_mask", "atten_mask", "scale", "keep_prob", "pre_tockens", "next_tockens", "inner_precise",
    "prefix", "actual_seq_qlen", "actual_seq_kvlen", "sparse_mode", "gen_mask_parallel", "sync",
}  # fmt: skip
GRAD_KEYWORDS = (FWD_KEYWORDS - {"scale"}) | {
    "softmax_max", "softmax_sum", "softmax_in", "attention_in", "scale_value", "seed", "offset", "numels",
}  # fmt: skip


def _standin_torch_npu() -> types.ModuleType:
    npu = _module("torch_npu")
    npu.calls = []

    def npu_fusion_attention(query, key, value, head_num, input_layout, **kw):  # noqa: ANN001, ANN003, ANN202
        assert set(kw) <= FWD_KEYWORDS, set(kw) - FWD_KEYWORDS
        mask, scale, mode = kw.get("atten_mask"), kw.get("scale", 1.0), kw.get("sparse_mode", 0)
        npu.calls.append({"op": "fwd", "layout": input_layout, "scale": scale, "mask": mask, "mode": mode})
        s = _npu_scores(query, key, head_num, input_layout, mask, scale, mode)
        row_max = s.amax(-1, keepdim=True)
        e = torch.exp(s - row_max)
        row_sum = e.sum(-1, keepdim=True)
        out = torch.einsum("bhqk,bkhd->bqhd", e / row_sum, value)
        stats = [t.expand(*t.shape[:-1], 8).float() for t in (row_max, row_sum)]
        return out, *stats, torch.empty(0), 0, 0, 0

    def npu_fusion_attention_grad(query, key, value, dy, head_num, input_layout, **kw):  # noqa: ANN001, ANN003, ANN202
        assert set(kw) <= GRAD_KEYWORDS, set(kw) - GRAD_KEYWORDS
        mask, scale, mode = kw.get("atten_mask"), kw.get("scale_value", 1.0), kw.get("sparse_mode", 0)
        npu.calls.append({"op": "grad", "layout": input_layout, "scale": scale, "mask": mask})
        softmax_max, softmax_sum = kw["softmax_max"], kw["softmax_sum"]
        assert softmax_max.shape[-1] == 8 and softmax_sum.shape == softmax_max.shape
        s = _npu_scores(query, key, head_num, input_layout, mask, scale, mode)
        p = torch.exp(s - softmax_max[..., :1].to(s.dtype)) / softmax_sum[..., :1].to(s.dtype)
        delta = (dy * kw["attention_in"]).sum(-1).transpose(1, 2)[..., None]
        dv = torch.einsum("bhqk,bqhd->bkhd", p, dy)
        ds = p * (torch.einsum("bqhd,bkhd->bhqk", dy, value) - delta)
        dq = torch.einsum("bhqk,bkhd->bqhd", ds, key) * scale
        dk = torch.einsum("bhqk,bqhd->bkhd", ds, query) * scale
        return dq, dk, dv, None

    npu.npu_fusion_attention = npu_fusion_attention
    npu.npu_fusion_attention_grad = npu_fusion_attention_grad
    return npu


@pytest.fixture
def standin_torch_npu(monkeypatch) -> types.ModuleType:  # noqa: ANN001
    """A torch_npu STAND-IN registered in sys.modules for one test (not the real package)."""
    npu = _standin_torch_npu()
    monkeypatch.setitem(sys.modules, "torch_npu", npu)
    return npu


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_npu_adapter_on_a_stand_in_torch_npu_gives_the_formula_output_and_lse(
    standin_torch_npu, causal: bool, padded: bool
) -> None:  # noqa: ANN001
    q, k, v, _ = _qkv()
    keep = _keep(causal, padded)
    valid = keep[:, :, -1:, :] if padded else None  # the key mask ring attention passes: [B, 1, 1, S]
    out, lse = get_backend("npu").forward(q, k, v, causal=causal, attn_mask=valid)
    ref_out, ref_lse = _formula(q, k, v, keep)
    torch.testing.assert_close(out, ref_out, rtol=0, atol=1e-6)
    torch.testing.assert_close(lse, ref_lse.float(), rtol=0, atol=1e-6)


def test_npu_adapter_passes_bsnd_true_masked_out_and_the_scale_to_a_stand_in_torch_npu(
    standin_torch_npu,
) -> None:  # noqa: ANN001
    q, k, v, _ = _qkv()
    valid = torch.ones(B, 1, 1, S, dtype=torch.bool)
    valid[1, ..., 6:] = False
    get_backend("npu").forward(q, k, v, attn_mask=valid)
    get_backend("npu").forward(q, k, v, causal=True)
    get_backend("npu").forward(q, k, v)
    masked, causal, plain = standin_torch_npu.calls
    assert masked["layout"] == "BSND" and masked["scale"] == pytest.approx(1 / math.sqrt(D))
    assert masked["mode"] == 0 and tuple(masked["mask"].shape) == (B, 1, S, S)
    assert masked["mask"][1, 0, :, 6:].all() and not masked["mask"][0].any()  # True = masked out
    assert causal["mode"] == 2 and tuple(causal["mask"].shape) == (2048, 2048)
    assert plain["mask"] is None and plain["mode"] == 0


@pytest.mark.parametrize("causal", [False, True])
def test_npu_adapter_block_backward_on_a_stand_in_torch_npu_sums_to_the_full_gradients(
    standin_torch_npu, causal: bool
) -> None:  # noqa: ANN001
    q, k, v, dout = _qkv()
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in leaves), is_causal=causal).transpose(
        1, 2
    ).backward(dout)
    backend = get_backend("npu")
    out, lse = backend.forward(q, k, v, causal=causal)
    # two KV blocks against the global out / lse, as in one ring pass (the first one causal when causal)
    g1 = backend.backward(dout, q, k[:, :5], v[:, :5], out, lse, attn_mask=_first_block_mask(causal))
    g2 = backend.backward(dout, q, k[:, 5:], v[:, 5:], out, lse, attn_mask=_second_block_mask(causal))
    dq, dk, dv = g1[0] + g2[0], torch.cat([g1[1], g2[1]], 1), torch.cat([g1[2], g2[2]], 1)
    for got, leaf in zip([dq, dk, dv], leaves, strict=True):
        torch.testing.assert_close(got, leaf.grad, rtol=0, atol=1e-6)
    assert all(call["scale"] == pytest.approx(1 / math.sqrt(D)) for call in standin_torch_npu.calls)


def _first_block_mask(causal: bool) -> torch.Tensor | None:
    return torch.ones(S, S, dtype=torch.bool).tril()[None, None, :, :5] if causal else None


def _second_block_mask(causal: bool) -> torch.Tensor | None:
    return torch.ones(S, S, dtype=torch.bool).tril()[None, None, :, 5:] if causal else None


# ---------------------------------------------------------------- flash_attn stand-in


def _standin_flash_attn() -> tuple[types.ModuleType, types.ModuleType]:
    package, interface = _module("flash_attn"), _module("flash_attn.flash_attn_interface")
    package.__version__ = "2.7.4"
    package.flash_attn_interface = interface

    def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, return_attn_probs=False):  # noqa: ANN001, ANN202
        assert return_attn_probs and dropout_p == 0.0
        keep = torch.ones(q.size(1), k.size(1), dtype=torch.bool).tril() if causal else None
        s = torch.einsum("bqhd,bkhd->bhqk", q, k) * softmax_scale
        s = s if keep is None else s.masked_fill(~keep, float("-inf"))
        return torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), v), s.logsumexp(-1).float(), None

    def _flash_attn_backward(
        dout,
        q,
        k,
        v,
        out,
        softmax_lse,
        dq,
        dk,
        dv,
        dropout_p,
        softmax_scale,
        causal,
        window_size_left,
        window_size_right,
        softcap,
        alibi_slopes,
        deterministic,
        rng_state=None,
    ):  # noqa: ANN001, ANN202
        assert softmax_lse.shape == (q.size(0), q.size(2), q.size(1)) and softmax_lse.is_contiguous()
        s = torch.einsum("bqhd,bkhd->bhqk", q, k) * softmax_scale
        if causal:
            s = s.masked_fill(~torch.ones(q.size(1), k.size(1), dtype=torch.bool).tril(), float("-inf"))
        p = torch.exp(s - softmax_lse[..., None].to(s.dtype))
        delta = (dout * out).sum(-1).transpose(1, 2)[..., None]
        ds = p * (torch.einsum("bqhd,bkhd->bhqk", dout, v) - delta)
        dv.copy_(torch.einsum("bhqk,bqhd->bkhd", p, dout))
        dq.copy_(torch.einsum("bhqk,bkhd->bqhd", ds, k) * softmax_scale)
        dk.copy_(torch.einsum("bhqk,bqhd->bkhd", ds, q) * softmax_scale)
        return torch.empty(0)

    package.flash_attn_func = flash_attn_func
    interface._flash_attn_backward = _flash_attn_backward
    return package, interface


@pytest.fixture
def standin_flash_attn(monkeypatch) -> None:  # noqa: ANN001
    """A flash_attn STAND-IN (package + flash_attn_interface) in sys.modules for one test."""
    package, interface = _standin_flash_attn()
    monkeypatch.setitem(sys.modules, "flash_attn", package)
    monkeypatch.setitem(sys.modules, "flash_attn.flash_attn_interface", interface)


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attn_adapter_on_a_stand_in_flash_attn_gives_formula_output_lse_and_block_gradients(
    standin_flash_attn, causal: bool
) -> None:  # noqa: ANN001
    q, k, v, dout = _qkv()
    backend = get_backend("flash_attn")
    out, lse = backend.forward(q, k, v, causal=causal)
    ref_out, ref_lse = _formula(q, k, v, _keep(causal, padded=False))
    torch.testing.assert_close(out, ref_out, rtol=0, atol=1e-12)
    torch.testing.assert_close(lse, ref_lse.float(), rtol=0, atol=1e-6)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in leaves), is_causal=causal).transpose(
        1, 2
    ).backward(dout)
    for got, leaf in zip(backend.backward(dout, q, k, v, out, lse, causal=causal), leaves, strict=True):
        torch.testing.assert_close(got, leaf.grad, rtol=0, atol=1e-6)


def test_flash_attn_older_than_2_7_is_not_offered(monkeypatch) -> None:  # noqa: ANN001
    package, interface = _standin_flash_attn()
    package.__version__ = "2.6.3"
    monkeypatch.setitem(sys.modules, "flash_attn", package)
    with pytest.raises(RuntimeError, match="not available"):
        get_backend("flash_attn")
