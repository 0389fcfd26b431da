"""Devices, ParallelState meshes, declarative FSDP2 plans, and Ulysses / Ring / USP context-parallel attention."""

__version__ = "0.1.0"

# --- devices, meshes, FSDP plans (imports) ---
from mm_parallel.broadcast import broadcast_tensor_dict
from mm_parallel.devices import get_device_type, get_dist_backend, get_local_device, init_distributed
from mm_parallel.explain import FSDPPlanExplanation, explain_fsdp_plan
from mm_parallel.fsdp_apply import FSDPPlanReport, FSDPUnit, apply_fsdp_plan
from mm_parallel.fsdp_plan import FSDPPlan, SubPlan, parse_dtype
from mm_parallel.grad_clip import clip_grad_norm_, total_grad_norm
from mm_parallel.grad_sync import fsdp_roots, set_gradient_sync
from mm_parallel.launcher import signal_when_launcher_dies
from mm_parallel.node_layout import (
    GROUP_ROLES,
    NodeLayout,
    describe_node_layout,
    mesh_rank_groups,
    node_crossings,
    sub_plan_rank_groups,
)
from mm_parallel.parallel_state import ParallelState
from mm_parallel.patterns import (
    PatternMatchError,
    match_modules,
    module_paths,
    pattern_matches,
    unmatched_segment,
)
from mm_parallel.process_exit import exit_process
from mm_parallel.timeouts import new_long_wait_group, set_collective_timeout
from mm_parallel.unit_layout import SKIP_ROOT_WRAP_ATTR, plan_units

# isort: split
# --- context parallel ---
from mm_parallel.attention_backends import (
    AttentionBackend,
    attention,
    available_backends,
    get_backend,
    lse_backends,
    register_backend,
    ring_backend_names,
)
from mm_parallel.attention_choice import AttentionChoice, resolve_attention_backend, use_attention_backend
from mm_parallel.attention_memory import BlockShape, block_step_bytes, kernel_workspace_bytes
from mm_parallel.packed_attention import packed_attention
from mm_parallel.packed_split import gather_packed, split_packed
from mm_parallel.packing import PackedLayout, PackedSequence
from mm_parallel.ring import ring_attention
from mm_parallel.sequence import (
    gather_for_usp,
    gather_sequence,
    local_token_indices,
    padded_length,
    real_token_counts,
    split_for_usp,
    split_sequence,
    usp_padded_length,
)
from mm_parallel.sequence_plan import SequenceParallelPlan
from mm_parallel.ulysses import ulysses_attention
from mm_parallel.usp import usp_attention

__all__ = [
    "__version__",
    "AttentionBackend",
    "AttentionChoice",
    "BlockShape",
    "PackedLayout",
    "PackedSequence",
    "SequenceParallelPlan",
    "attention",
    "available_backends",
    "block_step_bytes",
    "kernel_workspace_bytes",
    "gather_for_usp",
    "gather_packed",
    "gather_sequence",
    "get_backend",
    "local_token_indices",
    "lse_backends",
    "packed_attention",
    "padded_length",
    "real_token_counts",
    "register_backend",
    "resolve_attention_backend",
    "ring_attention",
    "ring_backend_names",
    "split_for_usp",
    "split_packed",
    "split_sequence",
    "ulysses_attention",
    "use_attention_backend",
    "usp_attention",
    "usp_padded_length",
]
# --- end context parallel ---


# --- devices, meshes, FSDP plans (exports) ---
__all__ += [
    "FSDPPlan",
    "FSDPPlanExplanation",
    "FSDPPlanReport",
    "FSDPUnit",
    "GROUP_ROLES",
    "NodeLayout",
    "ParallelState",
    "PatternMatchError",
    "SKIP_ROOT_WRAP_ATTR",
    "SubPlan",
    "apply_fsdp_plan",
    "broadcast_tensor_dict",
    "clip_grad_norm_",
    "describe_node_layout",
    "exit_process",
    "explain_fsdp_plan",
    "fsdp_roots",
    "get_device_type",
    "get_dist_backend",
    "get_local_device",
    "init_distributed",
    "match_modules",
    "module_paths",
    "mesh_rank_groups",
    "node_crossings",
    "parse_dtype",
    "pattern_matches",
    "unmatched_segment",
    "plan_units",
    "new_long_wait_group",
    "set_collective_timeout",
    "set_gradient_sync",
    "signal_when_launcher_dies",
    "sub_plan_rank_groups",
    "total_grad_norm",
]
