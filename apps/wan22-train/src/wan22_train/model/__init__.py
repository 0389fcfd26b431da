"""Native Wan2.x DiT: config, model, 3-D RoPE."""

from .config import WanDiTConfig, is_diffusers_config
from .rope import apply_rope, rope_axis_dims, rope_cos_sin
from .wan_dit import (
    AttentionFn,
    SequenceGatherFn,
    SequenceSplitFn,
    WanAttention,
    WanBlock,
    WanDiT,
    WanHead,
    sdpa_attention,
    timestep_sinusoid,
)

__all__ = [
    "AttentionFn",
    "SequenceGatherFn",
    "SequenceSplitFn",
    "WanAttention",
    "WanBlock",
    "WanDiT",
    "WanDiTConfig",
    "WanHead",
    "apply_rope",
    "is_diffusers_config",
    "rope_axis_dims",
    "rope_cos_sin",
    "sdpa_attention",
    "timestep_sinusoid",
]
