"""The real ``torch_npu`` and ``flash_attn`` functions the attention adapters call, pinned as data.

Neither package runs here, so the adapters are tested against stand-ins (``test_attention_adapters.py``).
A stand-in written from the same reading as the adapter would share its mistakes; these pins are read
from the packages' own sources, and every stand-in binds its arguments through them
(:func:`signature`), so a call the real function would refuse (a misspelt or missing keyword, a
keyword-only argument passed by position, a default assumed wrongly) fails a test. Re-read them when
the supported versions move.

Sources (read 2026-12-02):

- torch_npu: github.com/Ascend/pytorch, master at 9e73e708ab9350d203475609f36f8a43f6a0c2ab,
  ``torch_npu/distributed/tensor/_attention.py``: the registered schemas of
  ``npu::npu_fusion_attention`` and ``npu::npu_fusion_attention_grad`` (quoted beside their DTensor
  sharding strategies, whose Python signatures repeat them), and the ``softmax_max`` layout ``BNS8``
  (also ``torch_npu/_inductor/fx_passes/pattern_match/npu_fusion_attention_graph.py``:
  ``softmax_max = torch.empty([B, head_num, S1, 8], dtype=torch.float32)``).
- flash_attn 2.8.4: github.com/Dao-AILab/flash-attention at 0251105a2fb19d2957484b7f023cd8c115286ced,
  ``flash_attn/flash_attn_interface.py``: ``flash_attn_func`` (``FlashAttnFunc.forward`` returns
  ``(out, softmax_lse, S_dmask)`` when ``return_attn_probs``; ``softmax_lse`` is ``[B, H, Sq]``
  float32) and ``_flash_attn_backward`` (a ``torch.library.custom_op`` writing ``dq``, ``dk``, ``dv``).
- flash_attn varlen (packed attention): the same file at 005300258a22e5fc6be621063c3d5704e82b89d9 (read
  2026-12-07): ``flash_attn_varlen_func`` (returns ``(out, softmax_lse, S_dmask)`` with
  ``return_attn_probs``; ``softmax_lse`` is ``[nheads, total_q]`` float32, its fake registration
  ``_flash_attn_varlen_forward_fake``) and ``_flash_attn_varlen_backward`` (a custom op writing ``dq``,
  ``dk``, ``dv``; ``cu_seqlens_*`` int32 ``[batch + 1]``).
- torch_npu in TND layout (packed attention): ``actual_seq_qlen`` / ``actual_seq_kvlen`` are host lists of
  cumulative lengths without the leading 0 (MindSpeed calls ``actual_seq_qlen=cu_seqlens_q[1:].tolist()``);
  the softmax statistics' storage order, ``concat_i [N, len_i, 8]``, is MindSpeed's reading
  (``mindspeed/core/context_parallel/utils.py``, ``flatten_softmax`` / ``unflatten_softmax``), not a
  signature: the stand-in follows it, so a real NPU run is its check.
"""

from __future__ import annotations

import inspect
from typing import Any

REQUIRED = inspect.Parameter.empty
POS = inspect.Parameter.POSITIONAL_OR_KEYWORD
KW = inspect.Parameter.KEYWORD_ONLY
_INT_MAX = 2147483647

#: ``npu_fusion_attention(Tensor query, Tensor key, Tensor value, int head_num, str input_layout,
#: Tensor? pse=None, ..., str softmax_layout="", Tensor? sink=None) -> (Tensor x4, int x3)``
NPU_FUSION_ATTENTION: dict[str, Any] = {
    "params": [
        ("query", POS, REQUIRED), ("key", POS, REQUIRED), ("value", POS, REQUIRED), ("head_num", POS, REQUIRED),
        ("input_layout", POS, REQUIRED), ("pse", POS, None), ("padding_mask", POS, None), ("atten_mask", POS, None),
        ("scale", POS, 1.0), ("keep_prob", POS, 1.0), ("pre_tockens", POS, _INT_MAX), ("next_tockens", POS, _INT_MAX),
        ("inner_precise", POS, 0), ("prefix", POS, None), ("actual_seq_qlen", POS, None),
        ("actual_seq_kvlen", POS, None), ("sparse_mode", POS, 0), ("gen_mask_parallel", POS, True),
        ("sync", POS, False), ("softmax_layout", POS, ""), ("sink", POS, None),
    ],
    "returns": ("attention_out", "softmax_max", "softmax_sum", "softmax_out", "seed", "offset", "numels"),
}  # fmt: skip

#: ``npu_fusion_attention_grad(Tensor query, Tensor key, Tensor value, Tensor dy, int head_num,
#: str input_layout, *, Tensor? pse=None, ...) -> (Tensor x5)`` (older releases return 4: no sink grad)
NPU_FUSION_ATTENTION_GRAD: dict[str, Any] = {
    "params": [
        ("query", POS, REQUIRED), ("key", POS, REQUIRED), ("value", POS, REQUIRED), ("dy", POS, REQUIRED),
        ("head_num", POS, REQUIRED), ("input_layout", POS, REQUIRED), ("pse", KW, None), ("padding_mask", KW, None),
        ("atten_mask", KW, None), ("softmax_max", KW, None), ("softmax_sum", KW, None), ("softmax_in", KW, None),
        ("attention_in", KW, None), ("scale_value", KW, 1.0), ("keep_prob", KW, 1.0), ("pre_tockens", KW, _INT_MAX),
        ("next_tockens", KW, _INT_MAX), ("inner_precise", KW, 0), ("seed", KW, 0), ("offset", KW, 0),
        ("numels", KW, 0), ("prefix", KW, None), ("actual_seq_qlen", KW, None), ("actual_seq_kvlen", KW, None),
        ("sparse_mode", KW, 0), ("gen_mask_parallel", KW, True), ("sync", KW, False), ("softmax_layout", KW, ""),
        ("sink", KW, None),
    ],
    "returns": ("grad_query", "grad_key", "grad_value", "grad_pse", "grad_sink"),
}  # fmt: skip

#: ``softmax_max`` / ``softmax_sum``: float32 ``[B, N, Sq, 8]`` (each row's value repeated 8 times)
NPU_SOFTMAX_STATS_LAST_DIM = 8

FLASH_ATTN_VERSION = "2.8.4"

#: ``flash_attn.flash_attn_func``
FLASH_ATTN_FUNC: dict[str, Any] = {
    "params": [
        ("q", POS, REQUIRED), ("k", POS, REQUIRED), ("v", POS, REQUIRED), ("dropout_p", POS, 0.0),
        ("softmax_scale", POS, None), ("causal", POS, False), ("window_size", POS, (-1, -1)), ("softcap", POS, 0.0),
        ("alibi_slopes", POS, None), ("deterministic", POS, False), ("return_attn_probs", POS, False),
    ],
    "returns": ("out", "softmax_lse", "S_dmask"),  # with return_attn_probs=True; else out alone
}  # fmt: skip

#: ``flash_attn.flash_attn_interface._flash_attn_backward`` (returns ``softmax_d``; writes dq, dk, dv)
FLASH_ATTN_BACKWARD: dict[str, Any] = {
    "params": [
        ("dout", POS, REQUIRED), ("q", POS, REQUIRED), ("k", POS, REQUIRED), ("v", POS, REQUIRED),
        ("out", POS, REQUIRED), ("softmax_lse", POS, REQUIRED), ("dq", POS, REQUIRED), ("dk", POS, REQUIRED),
        ("dv", POS, REQUIRED), ("dropout_p", POS, REQUIRED), ("softmax_scale", POS, REQUIRED),
        ("causal", POS, REQUIRED), ("window_size_left", POS, REQUIRED), ("window_size_right", POS, REQUIRED),
        ("softcap", POS, REQUIRED), ("alibi_slopes", POS, REQUIRED), ("deterministic", POS, REQUIRED),
        ("rng_state", POS, None),
    ],
    "returns": ("softmax_d",),
}  # fmt: skip


#: ``flash_attn.flash_attn_varlen_func`` (2.8)
FLASH_ATTN_VARLEN_FUNC: dict[str, Any] = {
    "params": [
        ("q", POS, REQUIRED), ("k", POS, REQUIRED), ("v", POS, REQUIRED), ("cu_seqlens_q", POS, REQUIRED),
        ("cu_seqlens_k", POS, REQUIRED), ("max_seqlen_q", POS, REQUIRED), ("max_seqlen_k", POS, REQUIRED),
        ("dropout_p", POS, 0.0), ("softmax_scale", POS, None), ("causal", POS, False), ("window_size", POS, (-1, -1)),
        ("softcap", POS, 0.0), ("alibi_slopes", POS, None), ("deterministic", POS, False),
        ("return_attn_probs", POS, False), ("block_table", POS, None),
    ],
    "returns": ("out", "softmax_lse", "S_dmask"),  # with return_attn_probs=True; softmax_lse [nheads, total_q]
}  # fmt: skip

#: ``flash_attn.flash_attn_interface._flash_attn_varlen_backward`` (returns ``softmax_d``; writes dq, dk, dv)
FLASH_ATTN_VARLEN_BACKWARD: dict[str, Any] = {
    "params": [
        ("dout", POS, REQUIRED), ("q", POS, REQUIRED), ("k", POS, REQUIRED), ("v", POS, REQUIRED),
        ("out", POS, REQUIRED), ("softmax_lse", POS, REQUIRED), ("dq", POS, REQUIRED), ("dk", POS, REQUIRED),
        ("dv", POS, REQUIRED), ("cu_seqlens_q", POS, REQUIRED), ("cu_seqlens_k", POS, REQUIRED),
        ("max_seqlen_q", POS, REQUIRED), ("max_seqlen_k", POS, REQUIRED), ("dropout_p", POS, REQUIRED),
        ("softmax_scale", POS, REQUIRED), ("causal", POS, REQUIRED), ("window_size_left", POS, REQUIRED),
        ("window_size_right", POS, REQUIRED), ("softcap", POS, REQUIRED), ("alibi_slopes", POS, REQUIRED),
        ("deterministic", POS, REQUIRED), ("rng_state", POS, None),
    ],
    "returns": ("softmax_d",),
}  # fmt: skip


def signature(api: dict[str, Any]) -> inspect.Signature:
    """The pinned function as an ``inspect.Signature`` (bind a call to it to check the call)."""
    return inspect.Signature(
        [inspect.Parameter(name, kind, default=default) for name, kind, default in api["params"]]
    )


def bind(api: dict[str, Any], args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Every argument of a call to the pinned function, defaults filled in (raises TypeError for a call
    the real function would refuse)."""
    bound = signature(api).bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)
