"""Native Wan2.x DiT: config, model, 3-D RoPE, weights on disk."""

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
from .weights import load_wan_dit, save_wan_dit

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
    "load_wan_dit",
    "rope_axis_dims",
    "rope_cos_sin",
    "save_wan_dit",
    "sdpa_attention",
    "timestep_sinusoid",
]
