"""Native Wan2.x DiT: config, model, 3-D RoPE, weights on disk."""

from .config import WanDiTConfig, is_diffusers_config
from .packing import (
    PackedOps,
    PackingFn,
    context_parallel_ops,
    one_process_ops,
    outside_compile,
    packed_forward,
)
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
    "PackedOps",
    "PackingFn",
    "SequenceGatherFn",
    "SequenceSplitFn",
    "WanAttention",
    "WanBlock",
    "WanDiT",
    "WanDiTConfig",
    "WanHead",
    "apply_rope",
    "context_parallel_ops",
    "is_diffusers_config",
    "load_wan_dit",
    "one_process_ops",
    "outside_compile",
    "packed_forward",
    "rope_axis_dims",
    "rope_cos_sin",
    "save_wan_dit",
    "sdpa_attention",
    "timestep_sinusoid",
]
