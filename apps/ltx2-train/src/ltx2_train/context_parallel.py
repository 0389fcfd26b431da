"""Sequence parallelism (Ulysses, Ring, or both: USP) for diffusers' ``LTX2VideoTransformer3DModel``.

The upstream model is kept intact; it is patched, not copied. Two small pieces make it sequence
parallel over the context-parallel group (``ring x ulysses`` ranks), both driven by one
:class:`mm_parallel.SequenceParallelPlan` (streams ``"video"`` and ``"audio"``):

1. :func:`sequence_parallel_forward` splits the inputs that carry tokens along the sequence
   dimension before the upstream ``forward`` runs (:func:`mm_parallel.split_for_usp`, contiguous
   ring layout): the video tokens and the audio tokens (each its own stream, each zero-padded to a
   multiple of the group size), their RoPE coordinates (so every
   rank rotates its own tokens with its own positions) and per-token timesteps. Text is NOT split:
   every rank keeps all text tokens, so the text cross-attention needs no communication. After
   the upstream ``forward`` the two outputs are gathered and the padding dropped.
2. :class:`SequenceParallelAttnProcessor` replaces the attention processor of the four attentions
   that mix tokens of a split stream (video self, audio self, audio-to-video, video-to-audio) and
   computes attention with :func:`mm_parallel.usp_attention`: all-to-all sequence <-> heads over
   the Ulysses group, then ring attention over the ring group (non-causal, so the two
   cross-attentions may have queries and keys of different lengths). Attention is told each key
   stream's real length (ring blocks are cut to their real keys), padded queries are dropped at the
   gather.

Everything between (norms, modulation, feed-forward, projections) is per token and runs on the
local shard unchanged. That holds for every release's variant (2.0, 2.3, 2.5): the per-head output gate
of 2.3 / 2.5's gated attention (``to_gate_logits``, from each query token) is applied on the local query
tokens; their perturbed-attention processors (``perturbed_attn``) are replaced like the plain ones (an STG
perturbation is refused, training never asks for one); the prompt modulation (``sigma`` / ``audio_sigma``:
one value per sample, never split) and 2.5's fixed prompt table act on the text, which every rank holds
whole. (2.5's keyframe marker ``video_keyframes_mask``, per video token, is split with the video when
given; the training pipeline gives none, as diffusers' text/image-to-video pipelines do not.) Splits and
gathers are mm-parallel's autograd-correct adjoints, so the mean of the per-rank gradients over the group
equals the one-process gradient.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from diffusers.models.transformers.transformer_ltx2 import (
    apply_interleaved_rotary_emb,
    apply_split_rotary_emb,
)
from mm_parallel import SequenceParallelPlan
from torch import Tensor, nn

#: Attention modules of one ``LTX2VideoTransformerBlock`` whose keys come from a split stream,
#: with the stream their keys/values belong to. ``attn2`` / ``audio_attn2`` (text) stay upstream.
SEQUENCE_PARALLEL_ATTENTIONS = {
    "attn1": "video",
    "audio_attn1": "audio",
    "audio_to_video_attn": "audio",  # Q: video, K/V: audio
    "video_to_audio_attn": "video",  # Q: audio, K/V: video
}
#: Forward arguments that sequence parallelism does not support (they index the full sequence).
UNSUPPORTED_INPUTS = ("video_self_attention_mask", "spatio_temporal_guidance_blocks", "perturbation_mask")


#: Ring split layout: attention here is never causal, so contiguous shards balance the work already.
LAYOUT = "contiguous"


class SequenceParallelAttnProcessor:
    """``LTX2AudioVideoAttnProcessor`` with its attention computed by :func:`mm_parallel.usp_attention`.

    Projections, RMS norms, RoPE and the optional per-head gate are the upstream steps on local
    tokens; only the attention itself communicates. The projections go to the plan's attention
    uncomputed, so its Ulysses all-to-alls may overlap them (``parallel.ulysses_overlap``).
    """

    def __init__(self, plan: SequenceParallelPlan, key_stream: str) -> None:
        self.plan = plan
        self.key_stream = key_stream

    def __call__(
        self,
        attn: nn.Module,
        hidden_states: Tensor,
        encoder_hidden_states: Tensor | None = None,
        attention_mask: Tensor | None = None,
        query_rotary_emb: tuple[Tensor, Tensor] | None = None,
        key_rotary_emb: tuple[Tensor, Tensor] | None = None,
        perturbation_mask: Tensor | None = None,
        all_perturbed: bool | Tensor | None = None,
    ) -> Tensor:
        if attention_mask is not None or perturbation_mask is not None or bool(all_perturbed):
            raise ValueError(
                "LTX-2 sequence parallelism: self/audio-video attention masks and STG perturbation "
                "are not supported with parallel.ulysses_parallel_size x ring_attention_size > 1"
            )
        kv_input = hidden_states if encoder_hidden_states is None else encoder_hidden_states
        gate_logits = attn.to_gate_logits(hidden_states) if attn.to_gate_logits is not None else None
        rotate = apply_interleaved_rotary_emb if attn.rope_type == "interleaved" else apply_split_rotary_emb

        # 1. Projections + RMS norm over all heads, 2. RoPE with this rank's positions (local tokens):
        #    [B, S_local, H, D], each projected when the plan's attention asks (its all-to-all may overlap
        #    the next projection)
        def project_q() -> Tensor:
            query = attn.norm_q(attn.to_q(hidden_states))
            query = query if query_rotary_emb is None else rotate(query, query_rotary_emb)
            return query.unflatten(2, (attn.heads, -1))

        def project_k() -> Tensor:
            key = attn.norm_k(attn.to_k(kv_input))
            if query_rotary_emb is not None:
                key = rotate(key, key_rotary_emb if key_rotary_emb is not None else query_rotary_emb)
            return key.unflatten(2, (attn.heads, -1))

        def project_v() -> Tensor:
            return attn.to_v(kv_input).unflatten(2, (attn.heads, -1))

        # 3. USP attention (Ulysses all-to-all, then the ring): [B, S_local, H, D] in and out
        out = self.plan.attention(project_q, project_k, project_v, key_stream=self.key_stream)  # in q's dtype
        # 4. Optional per-head gate, output projection
        if gate_logits is not None:
            out = out * (2.0 * torch.sigmoid(gate_logits)).unsqueeze(-1)
        out = attn.to_out[0](out.flatten(2, 3))
        return attn.to_out[1](out)


def install_attention_processors(blocks: nn.ModuleList, plan: SequenceParallelPlan) -> int:
    """Set :class:`SequenceParallelAttnProcessor` on the sequence-parallel attentions of every block;
    return the count."""
    count = 0
    for block in blocks:
        for name, stream in SEQUENCE_PARALLEL_ATTENTIONS.items():
            getattr(block, name).set_processor(SequenceParallelAttnProcessor(plan, stream))
            count += 1
    return count


def sequence_parallel_forward(
    model: nn.Module,
    upstream_forward: Callable[..., Any],
    plan: SequenceParallelPlan,
    *args: Any,
    **kwargs: Any,
) -> Any:
    """Run ``upstream_forward`` (the diffusers forward of ``model``) on this rank's token shards.

    Returns what the upstream forward returns (``AudioVisualModelOutput`` or a tuple), with full
    (gathered) video and audio outputs on every rank.
    """
    bound = inspect.signature(upstream_forward).bind(*args, **kwargs)
    bound.apply_defaults()
    a = dict(bound.arguments)
    for key in UNSUPPORTED_INPUTS:
        if a.get(key) is not None:
            raise ValueError(f"LTX-2 sequence parallelism: forward argument {key!r} is not supported")
    video, audio = a["hidden_states"], a["audio_hidden_states"]
    batch, video_len, audio_len = video.size(0), video.size(1), audio.size(1)
    # 1. RoPE coordinates of the full sequences (same computation as upstream), split below.
    if a.get("video_coords") is None:
        a["video_coords"] = model.rope.prepare_video_coords(
            batch, a["num_frames"], a["height"], a["width"], video.device, fps=a["fps"]
        )
    if a.get("audio_coords") is None:
        a["audio_coords"] = model.audio_rope.prepare_audio_coords(batch, a["audio_num_frames"], audio.device)

    # 2. Token streams, their positions and their per-token inputs (each split remembers its
    #    stream's real length for the attention over it).
    split = plan.split
    a["hidden_states"], a["audio_hidden_states"] = split(video, 1, "video"), split(audio, 1, "audio")
    a["video_coords"], a["audio_coords"] = (
        split(a["video_coords"], 2, "video"),
        split(a["audio_coords"], 2, "audio"),
    )
    for key, stream, length in (
        ("timestep", "video", video_len),
        ("audio_timestep", "audio", audio_len),
        ("video_keyframes_mask", "video", video_len),
    ):
        value = a.get(key)
        if isinstance(value, Tensor) and value.dim() >= 2 and value.size(1) == length and length > 1:
            a[key] = split(value, 1, stream)
    return_dict = a.pop("return_dict", True)
    video_out, audio_out = upstream_forward(**a, return_dict=False)
    # 3. Full outputs on every rank (padding dropped).
    video_out, audio_out = _full(video_out, video_len, plan), _full(audio_out, audio_len, plan)
    if not return_dict:
        return video_out, audio_out
    from diffusers.models.transformers.transformer_ltx2 import AudioVisualModelOutput

    return AudioVisualModelOutput(sample=video_out, audio_sample=audio_out)


def _full(x: Tensor, length: int, plan: SequenceParallelPlan) -> Tensor:
    """Full sequence of ``x`` on every rank; a padded one is cut to ``length`` (a copy, not a view)."""
    full = plan.gather(x, 1, length)
    return full if x.size(1) * plan.size == length else full.clone()
