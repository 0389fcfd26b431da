"""The NPU and flash_attn adapters' argument building, against STAND-IN modules (not the real packages).

Neither ``torch_npu`` nor ``flash_attn`` runs here, so each test registers, for its own duration
only, a stand-in module under the real name that computes what the package documents on CPU
float64 tensors and records how it was called. Every stand-in binds its call through the real
function's signature, pinned from the package's source in ``upstream_apis.py`` (parameter names,
kinds, defaults, outputs), so a call the real function would refuse fails here too:

- ``torch_npu`` stand-in: ``npu_fusion_attention`` / ``npu_fusion_attention_grad`` with layout
  ``BSND``, ``atten_mask`` True = masked out, ``scale`` defaulting to 1, ``sparse_mode=2`` =
  left-up causal from the compressed 2048 x 2048 mask, and ``softmax_max`` / ``softmax_sum``
  ``[B, N, Sq, 8]`` (the row max and the row sum of ``exp(s - max)``, repeated 8 times); the grad
  rebuilds the probabilities as ``exp(s - softmax_max) / softmax_sum``.
- ``flash_attn`` stand-in (2.7 signatures): ``flash_attn_func(..., return_attn_probs=True)`` returns
  ``(out, lse [B, H, Sq], probs)``; ``flash_attn_interface._flash_attn_backward`` writes dq, dk, dv.
- packed (variable-length) blocks: ``flash_attn_varlen_func`` / ``_flash_attn_varlen_backward``
  (``[total, H, D]``, int32 ``cu_seqlens``, LSE ``[H, total_q]``) and ``npu_fusion_attention`` in the
  ``TND`` layout (``actual_seq_qlen`` / ``actual_seq_kvlen`` cumulative without the leading 0, softmax
  statistics stored ``concat_i [N, len_i, 8]``: MindSpeed's reading, see ``upstream_apis.py``).

A wrong layout, mask polarity, scale or LSE formula in the adapters gives wrong numbers here.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import math
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from mm_parallel import get_backend

B, S, H, D = 2, 10, 3, 8


def _load_pins() -> types.ModuleType:
    """``upstream_apis.py`` beside this file (tests import with --import-mode=importlib: no sys.path)."""
    spec = importlib.util.spec_from_file_location(
        "mm_parallel_upstream_apis", Path(__file__).with_name("upstream_apis.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


UPSTREAM = _load_pins()


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


def _standin_torch_npu() -> types.ModuleType:
    npu = _module("torch_npu")
    npu.calls = []
    fwd_api, grad_api = UPSTREAM.NPU_FUSION_ATTENTION, UPSTREAM.NPU_FUSION_ATTENTION_GRAD
    stats = UPSTREAM.NPU_SOFTMAX_STATS_LAST_DIM

    def npu_fusion_attention(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        a = UPSTREAM.bind(fwd_api, args, kwargs)  # TypeError for a call the real op refuses
        if a["input_layout"] == "TND":
            return _tnd_forward(npu, a)
        query, key, value, layout = a["query"], a["key"], a["value"], a["input_layout"]
        mask, scale, mode = a["atten_mask"], a["scale"], a["sparse_mode"]
        npu.calls.append({"op": "fwd", "layout": layout, "scale": scale, "mask": mask, "mode": mode})
        s = _npu_scores(query, key, a["head_num"], layout, mask, scale, mode)
        row_max = s.amax(-1, keepdim=True)
        e = torch.exp(s - row_max)
        row_sum = e.sum(-1, keepdim=True)
        out = torch.einsum("bhqk,bkhd->bqhd", e / row_sum, value)
        softmax_max, softmax_sum = (t.expand(*t.shape[:-1], stats).float() for t in (row_max, row_sum))
        outputs = (out, softmax_max, softmax_sum, torch.empty(0), 0, 0, 0)
        assert len(outputs) == len(fwd_api["returns"])
        return outputs

    def npu_fusion_attention_grad(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        a = UPSTREAM.bind(grad_api, args, kwargs)
        if a["input_layout"] == "TND":
            return _tnd_grad(npu, a)
        query, key, value, dy, layout = a["query"], a["key"], a["value"], a["dy"], a["input_layout"]
        mask, scale, mode = a["atten_mask"], a["scale_value"], a["sparse_mode"]
        npu.calls.append({"op": "grad", "layout": layout, "scale": scale, "mask": mask})
        softmax_max, softmax_sum = a["softmax_max"], a["softmax_sum"]
        assert softmax_max.shape[-1] == stats and softmax_sum.shape == softmax_max.shape
        s = _npu_scores(query, key, a["head_num"], layout, mask, scale, mode)
        p = torch.exp(s - softmax_max[..., :1].to(s.dtype)) / softmax_sum[..., :1].to(s.dtype)
        delta = (dy * a["attention_in"]).sum(-1).transpose(1, 2)[..., None]
        dv = torch.einsum("bhqk,bqhd->bkhd", p, dy)
        ds = p * (torch.einsum("bqhd,bkhd->bhqk", dy, value) - delta)
        dq = torch.einsum("bhqk,bkhd->bqhd", ds, key) * scale
        dk = torch.einsum("bhqk,bqhd->bkhd", ds, query) * scale
        outputs = (dq, dk, dv, None, None)
        assert len(outputs) == len(grad_api["returns"])
        return outputs

    npu_fusion_attention.__signature__ = UPSTREAM.signature(fwd_api)
    npu_fusion_attention_grad.__signature__ = UPSTREAM.signature(grad_api)
    npu.npu_fusion_attention = npu_fusion_attention
    npu.npu_fusion_attention_grad = npu_fusion_attention_grad
    return npu


def _tnd_spans(a: dict) -> list[tuple[int, int, int, int]]:
    """(q start, q length, k start, k length) of every segment from the cumulative lists (no leading 0)."""
    q_ends, k_ends = a["actual_seq_qlen"], a["actual_seq_kvlen"]
    assert isinstance(q_ends, list) and isinstance(k_ends, list) and len(q_ends) == len(k_ends)
    assert q_ends[-1] == a["query"].size(0) and k_ends[-1] == a["key"].size(0)
    q_starts, k_starts = [0, *q_ends[:-1]], [0, *k_ends[:-1]]
    return [
        (qs, qe - qs, ks, ke - ks) for qs, qe, ks, ke in zip(q_starts, q_ends, k_starts, k_ends, strict=True)
    ]


def _tnd_forward(npu: types.ModuleType, a: dict) -> tuple:
    """TND forward: each segment alone; statistics stored segment by segment, heads first."""
    assert a["atten_mask"] is None and a["sparse_mode"] == 0 and a["query"].dim() == 3
    npu.calls.append({"op": "fwd", "layout": "TND", "scale": a["scale"], "q": a["actual_seq_qlen"],
                      "k": a["actual_seq_kvlen"]})  # fmt: skip
    outs, maxes, sums = [], [], []
    for qs, lq, ks, lk in _tnd_spans(a):
        s = torch.einsum("qhd,khd->hqk", a["query"][qs : qs + lq], a["key"][ks : ks + lk]) * a["scale"]
        row_max = s.amax(-1, keepdim=True)
        e = torch.exp(s - row_max)
        row_sum = e.sum(-1, keepdim=True)
        outs.append(torch.einsum("hqk,khd->qhd", e / row_sum, a["value"][ks : ks + lk]))
        maxes.append(row_max.reshape(-1))  # [N, len] in storage order
        sums.append(row_sum.reshape(-1))
    stats = UPSTREAM.NPU_SOFTMAX_STATS_LAST_DIM
    softmax_max, softmax_sum = (
        torch.cat(t).view(-1, a["head_num"])[..., None].expand(-1, a["head_num"], stats).float()
        for t in (maxes, sums)
    )  # shape [T, N, 8], stored concat_i [N, len_i, 8]
    return (torch.cat(outs), softmax_max.contiguous(), softmax_sum.contiguous(), torch.empty(0), 0, 0, 0)


def _tnd_grad(npu: types.ModuleType, a: dict) -> tuple:
    """TND grad from the given statistics (read back in the same storage order)."""
    npu.calls.append({"op": "grad", "layout": "TND", "scale": a["scale_value"], "q": a["actual_seq_qlen"]})
    heads, scale = a["head_num"], a["scale_value"]
    flat_max = a["softmax_max"][..., 0].reshape(-1)
    flat_sum = a["softmax_sum"][..., 0].reshape(-1)
    dqs, dks, dvs = [], [], []
    for qs, lq, ks, lk in _tnd_spans(a):
        q, k, v = a["query"][qs : qs + lq], a["key"][ks : ks + lk], a["value"][ks : ks + lk]
        dy, o = a["dy"][qs : qs + lq], a["attention_in"][qs : qs + lq]
        row_max = flat_max[qs * heads : (qs + lq) * heads].view(heads, lq, 1).to(q.dtype)
        row_sum = flat_sum[qs * heads : (qs + lq) * heads].view(heads, lq, 1).to(q.dtype)
        p = torch.exp(torch.einsum("qhd,khd->hqk", q, k) * scale - row_max) / row_sum
        delta = (dy * o).sum(-1).t()[..., None]
        ds = p * (torch.einsum("qhd,khd->hqk", dy, v) - delta)
        dqs.append(torch.einsum("hqk,khd->qhd", ds, k) * scale)
        dks.append(torch.einsum("hqk,qhd->khd", ds, q) * scale)
        dvs.append(torch.einsum("hqk,qhd->khd", p, dy))
    return (torch.cat(dqs), torch.cat(dks), torch.cat(dvs), None, None)


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
    package.__version__ = UPSTREAM.FLASH_ATTN_VERSION
    package.flash_attn_interface = interface
    fwd_api, bwd_api = UPSTREAM.FLASH_ATTN_FUNC, UPSTREAM.FLASH_ATTN_BACKWARD

    def flash_attn_func(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        a = UPSTREAM.bind(fwd_api, args, kwargs)
        q, k, v, scale, causal = a["q"], a["k"], a["v"], a["softmax_scale"], a["causal"]
        assert a["return_attn_probs"] and a["dropout_p"] == 0.0 and a["window_size"] == (-1, -1)
        scale = q.size(-1) ** -0.5 if scale is None else scale
        keep = torch.ones(q.size(1), k.size(1), dtype=torch.bool).tril() if causal else None
        s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
        s = s if keep is None else s.masked_fill(~keep, float("-inf"))
        outputs = (torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), v), s.logsumexp(-1).float(), torch.empty(0))
        assert len(outputs) == len(fwd_api["returns"])
        return outputs

    def _flash_attn_backward(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        a = UPSTREAM.bind(bwd_api, args, kwargs)
        dout, q, k, v, out, lse = (a[n] for n in ("dout", "q", "k", "v", "out", "softmax_lse"))
        scale, causal = a["softmax_scale"], a["causal"]
        assert (a["window_size_left"], a["window_size_right"], a["softcap"], a["dropout_p"]) == (
            -1,
            -1,
            0.0,
            0.0,
        )
        assert lse.shape == (q.size(0), q.size(2), q.size(1)) and lse.is_contiguous()
        s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
        if causal:
            s = s.masked_fill(~torch.ones(q.size(1), k.size(1), dtype=torch.bool).tril(), float("-inf"))
        p = torch.exp(s - lse[..., None].to(s.dtype))
        delta = (dout * out).sum(-1).transpose(1, 2)[..., None]
        ds = p * (torch.einsum("bqhd,bkhd->bhqk", dout, v) - delta)
        a["dv"].copy_(torch.einsum("bhqk,bqhd->bkhd", p, dout))
        a["dq"].copy_(torch.einsum("bhqk,bkhd->bqhd", ds, k) * scale)
        a["dk"].copy_(torch.einsum("bhqk,bqhd->bkhd", ds, q) * scale)
        return torch.empty(0)

    varlen_api, varlen_bwd_api = UPSTREAM.FLASH_ATTN_VARLEN_FUNC, UPSTREAM.FLASH_ATTN_VARLEN_BACKWARD

    def _varlen_spans(a: dict) -> list[tuple[int, int, int, int]]:
        cu_q, cu_k = a["cu_seqlens_q"], a["cu_seqlens_k"]
        assert cu_q.dtype == cu_k.dtype == torch.int32 and cu_q.numel() == cu_k.numel()
        assert int(cu_q[-1]) == a["q"].size(0) and int(cu_k[-1]) == a["k"].size(0)
        lq, lk = cu_q.diff().tolist(), cu_k.diff().tolist()
        assert a["max_seqlen_q"] == max(lq) and a["max_seqlen_k"] == max(lk)
        return [(int(cu_q[i]), lq[i], int(cu_k[i]), lk[i]) for i in range(len(lq))]

    def flash_attn_varlen_func(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        a = UPSTREAM.bind(varlen_api, args, kwargs)
        assert a["return_attn_probs"] and not a["causal"] and a["dropout_p"] == 0.0 and a["q"].dim() == 3
        outs, lses = [], []
        for qs, lq, ks, lk in _varlen_spans(a):
            s = torch.einsum("qhd,khd->hqk", a["q"][qs : qs + lq], a["k"][ks : ks + lk]) * a["softmax_scale"]
            outs.append(torch.einsum("hqk,khd->qhd", s.softmax(-1), a["v"][ks : ks + lk]))
            lses.append(s.logsumexp(-1).float())  # [H, lq]
        outputs = (torch.cat(outs), torch.cat(lses, 1), torch.empty(0))
        assert len(outputs) == len(varlen_api["returns"])
        return outputs

    def _flash_attn_varlen_backward(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        a = UPSTREAM.bind(varlen_bwd_api, args, kwargs)
        lse, scale = a["softmax_lse"], a["softmax_scale"]
        assert lse.shape == (a["q"].size(1), a["q"].size(0)) and lse.is_contiguous() and not a["causal"]
        for qs, lq, ks, lk in _varlen_spans(a):
            q, k, v = a["q"][qs : qs + lq], a["k"][ks : ks + lk], a["v"][ks : ks + lk]
            dout, out = a["dout"][qs : qs + lq], a["out"][qs : qs + lq]
            p = torch.exp(torch.einsum("qhd,khd->hqk", q, k) * scale - lse[:, qs : qs + lq, None].to(q.dtype))
            ds = p * (torch.einsum("qhd,khd->hqk", dout, v) - (dout * out).sum(-1).t()[..., None])
            a["dq"][qs : qs + lq] = torch.einsum("hqk,khd->qhd", ds, k) * scale
            a["dk"][ks : ks + lk] = torch.einsum("hqk,qhd->khd", ds, q) * scale
            a["dv"][ks : ks + lk] = torch.einsum("hqk,qhd->khd", p, dout)
        return torch.empty(0)

    flash_attn_func.__signature__ = UPSTREAM.signature(fwd_api)
    _flash_attn_backward.__signature__ = UPSTREAM.signature(bwd_api)
    flash_attn_varlen_func.__signature__ = UPSTREAM.signature(varlen_api)
    _flash_attn_varlen_backward.__signature__ = UPSTREAM.signature(varlen_bwd_api)
    package.flash_attn_func = flash_attn_func
    package.flash_attn_varlen_func = flash_attn_varlen_func
    interface._flash_attn_backward = _flash_attn_backward
    interface._flash_attn_varlen_backward = _flash_attn_varlen_backward
    return package, interface


@pytest.fixture
def standin_flash_attn(monkeypatch) -> types.ModuleType:  # noqa: ANN001
    """A flash_attn STAND-IN (package + flash_attn_interface) in sys.modules for one test."""
    package, interface = _standin_flash_attn()
    monkeypatch.setitem(sys.modules, "flash_attn", package)
    monkeypatch.setitem(sys.modules, "flash_attn.flash_attn_interface", interface)
    return package


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


def test_the_stand_ins_refuse_calls_the_real_functions_refuse(standin_torch_npu, standin_flash_attn) -> None:  # noqa: ANN001
    q, k, v, dout = _qkv()
    with pytest.raises(TypeError, match="scale_value"):  # the grad's name for the scale, not the forward's
        standin_torch_npu.npu_fusion_attention(q, k, v, H, "BSND", scale_value=0.5)
    with pytest.raises(TypeError, match="positional"):  # everything after input_layout is keyword-only
        standin_torch_npu.npu_fusion_attention_grad(q, k, v, dout, H, "BSND", None)
    from flash_attn.flash_attn_interface import _flash_attn_backward

    with pytest.raises(TypeError, match="missing"):  # no defaults before rng_state
        _flash_attn_backward(dout, q, k, v, dout, None, q, k, v, 0.0, 1.0, False)


# ---------------------------------------------------------------- packed (variable-length) blocks

Q_LENGTHS, K_LENGTHS = (3, 5, 2), (4, 1, 6)  # paired segments: cross-attention of two packings


def _varlen_inputs() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    q, dout = (torch.randn(B, sum(Q_LENGTHS), H, D, generator=gen, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(B, sum(K_LENGTHS), H, D, generator=gen, dtype=torch.float64) for _ in range(2))
    return [q, k, v, dout]


def _each_segment_alone(q, k, v, dout) -> list[torch.Tensor]:  # noqa: ANN001
    """SDPA of every segment pair on its own: [out, lse, dq, dk, dv]."""
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    outs, lses = [], []
    for qs, lq, ks, lk in zip((0, 3, 8), Q_LENGTHS, (0, 4, 5), K_LENGTHS, strict=True):
        seg = [leaves[0][:, qs : qs + lq], leaves[1][:, ks : ks + lk], leaves[2][:, ks : ks + lk]]
        outs.append(F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in seg)).transpose(1, 2))
        s = torch.einsum("bqhd,bkhd->bhqk", seg[0], seg[1]).detach() / math.sqrt(D)
        lses.append(s.logsumexp(-1).transpose(1, 2))
    out = torch.cat(outs, 1)
    out.backward(dout)
    return [out.detach(), torch.cat(lses, 1)] + [t.grad for t in leaves]


@pytest.mark.parametrize("name", ["flash_attn", "npu"])
def test_varlen_adapters_on_stand_ins_give_each_segment_pairs_attention_lse_and_gradients(
    standin_flash_attn, standin_torch_npu, name: str
) -> None:  # noqa: ANN001
    q, k, v, dout = _varlen_inputs()
    backend = get_backend(name)
    out, lse = backend.varlen_forward(q, k, v, Q_LENGTHS, K_LENGTHS, scale=1 / math.sqrt(D))
    grads = backend.varlen_backward(dout, q, k, v, out, lse, Q_LENGTHS, K_LENGTHS, scale=1 / math.sqrt(D))
    ref_out, ref_lse, *ref_grads = _each_segment_alone(q, k, v, dout)
    torch.testing.assert_close(out, ref_out, rtol=0, atol=1e-12)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=0, atol=1e-6)  # the kernels' LSE is float32
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_npu_varlen_adapter_passes_tnd_and_cumulative_lengths_of_every_batch_row(standin_torch_npu) -> None:  # noqa: ANN001
    q, k, v, dout = _varlen_inputs()
    backend = get_backend("npu")
    out, lse = backend.varlen_forward(q, k, v, Q_LENGTHS, K_LENGTHS, scale=0.25)
    backend.varlen_backward(dout, q, k, v, out, lse, Q_LENGTHS, K_LENGTHS, scale=0.25)
    forward, grad = standin_torch_npu.calls
    assert forward["layout"] == grad["layout"] == "TND" and forward["scale"] == grad["scale"] == 0.25
    assert forward["q"] == grad["q"] == [3, 8, 10, 13, 18, 20]  # B = 2 rows of (3, 5, 2), no leading 0
    assert forward["k"] == [4, 5, 11, 15, 16, 22]


def test_tnd_statistics_convert_to_token_rows_and_back() -> None:
    from mm_parallel.npu_attention import tnd_rows, tnd_stats

    rows = torch.arange(10 * 3, dtype=torch.float32).view(10, 3)  # [T, N]
    stats = tnd_stats(rows, [4, 6])
    assert stats.shape == (10, 3, 8)
    assert (
        stats[..., 0].reshape(-1)[:12].tolist() == rows[:4].t().reshape(-1).tolist()
    )  # segment 0, heads first
    assert torch.equal(tnd_rows(stats, [4, 6]), rows)
