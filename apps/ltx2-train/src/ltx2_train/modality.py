"""Which parameters of an ``LTX2VideoTransformer3DModel`` belong to its video and to its audio branch.

A module belongs to the stream whose hidden states its output is added to or modulates: ``attn1``,
``attn2``, ``ff``, ``audio_to_video_attn`` (queries: video) and the video heads, embeddings and
modulation tables are the video branch; ``audio_*`` (``audio_attn1``, ``audio_ff``, ...),
``video_to_audio_attn`` (queries: audio) and ``av_cross_attn_audio_*`` the audio branch. The name is
the parameter path's first component, after ``transformer_blocks.<i>.`` inside a block. A parameter
under a name neither list holds is refused (a diffusers version with new modules must be placed by
hand, not guessed).
"""

from __future__ import annotations

import re

from torch import nn

VIDEO_MODULES = frozenset({
    "attn1", "attn2", "ff", "audio_to_video_attn", "proj_in", "proj_out", "caption_projection", "time_embed",
    "scale_shift_table", "video_a2v_cross_attn_scale_shift_table", "av_cross_attn_video_scale_shift",
    "av_cross_attn_video_a2v_gate", "prompt_adaln", "prompt_scale_shift_table", "keyframes_abs_pos_embedding",
})  # fmt: skip
AUDIO_MODULES = frozenset({
    "audio_attn1", "audio_attn2", "audio_ff", "video_to_audio_attn", "audio_proj_in", "audio_proj_out",
    "audio_caption_projection", "audio_time_embed", "audio_scale_shift_table",
    "audio_a2v_cross_attn_scale_shift_table", "av_cross_attn_audio_scale_shift", "av_cross_attn_audio_v2a_gate",
    "audio_prompt_adaln", "audio_prompt_scale_shift_table",
})  # fmt: skip
MODALITIES = ("video", "audio")
_BLOCK = re.compile(r"^transformer_blocks\.\d+\.")


def parameter_modality(name: str) -> str:
    """``"video"`` or ``"audio"``: the branch of the parameter at path ``name`` (module docstring)."""
    head = _BLOCK.sub("", name).split(".", 1)[0]
    if head in VIDEO_MODULES:
        return "video"
    if head in AUDIO_MODULES:
        return "audio"
    raise ValueError(
        f"LTX-2 parameter {name!r}: its module {head!r} is in neither the video nor the audio branch "
        "(ltx2_train.modality.VIDEO_MODULES / AUDIO_MODULES); place it there"
    )


def branch_parameters(model: nn.Module, modality: str) -> dict[str, nn.Parameter]:
    """The parameters of ``model``'s ``modality`` branch (``video`` or ``audio``), by path."""
    if modality not in MODALITIES:
        raise ValueError(f"modality {modality!r}: expected one of {list(MODALITIES)}")
    return {n: p for n, p in model.named_parameters() if parameter_modality(n) == modality}


def freeze_branch(model: nn.Module, modality: str) -> list[str]:
    """``requires_grad=False`` on ``modality``'s branch of ``model``: the optimizer (trainable parameters
    only) never sees it and backward gives it no gradient. Returns the frozen parameter paths."""
    frozen = branch_parameters(model, modality)
    for param in frozen.values():
        param.requires_grad_(False)
    return sorted(frozen)
