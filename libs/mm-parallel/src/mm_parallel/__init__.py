"""Devices, ParallelState meshes, declarative FSDP2 plans, and Ulysses / Ring / USP context-parallel attention.

The public names below are imported on first use (PEP 562), so ``import mm_parallel`` and its console
script's ``--help`` / ``--version`` do not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    # name: submodule that defines it
    "AttentionBackend": "attention_backends",
    "attention": "attention_backends",
    "available_backends": "attention_backends",
    "get_backend": "attention_backends",
    "lse_backends": "attention_backends",
    "register_backend": "attention_backends",
    "ring_backend_names": "attention_backends",
    "AttentionChoice": "attention_choice",
    "resolve_attention_backend": "attention_choice",
    "use_attention_backend": "attention_choice",
    "BlockShape": "attention_memory",
    "block_step_bytes": "attention_memory",
    "kernel_workspace_bytes": "attention_memory",
    "broadcast_tensor_dict": "broadcast",
    "get_device_type": "devices",
    "get_dist_backend": "devices",
    "get_local_device": "devices",
    "init_distributed": "devices",
    "FSDPPlanExplanation": "explain",
    "explain_fsdp_plan": "explain",
    "FSDPPlanReport": "fsdp_apply",
    "FSDPUnit": "fsdp_apply",
    "apply_fsdp_plan": "fsdp_apply",
    "FSDPPlan": "fsdp_plan",
    "SubPlan": "fsdp_plan",
    "parse_dtype": "fsdp_plan",
    "clip_grad_norm_": "grad_clip",
    "total_grad_norm": "grad_clip",
    "fsdp_roots": "grad_sync",
    "set_gradient_sync": "grad_sync",
    "signal_when_launcher_dies": "launcher",
    "GROUP_ROLES": "node_layout",
    "NodeLayout": "node_layout",
    "describe_node_layout": "node_layout",
    "mesh_rank_groups": "node_layout",
    "node_crossings": "node_layout",
    "sub_plan_rank_groups": "node_layout",
    "ParallelState": "parallel_state",
    "PatternMatchError": "patterns",
    "match_modules": "patterns",
    "module_paths": "patterns",
    "pattern_matches": "patterns",
    "unmatched_segment": "patterns",
    "exit_process": "process_exit",
    "ring_attention": "ring",
    "gather_for_usp": "sequence",
    "gather_sequence": "sequence",
    "local_token_indices": "sequence",
    "padded_length": "sequence",
    "real_token_counts": "sequence",
    "split_for_usp": "sequence",
    "split_sequence": "sequence",
    "usp_padded_length": "sequence",
    "SequenceParallelPlan": "sequence_plan",
    "new_long_wait_group": "timeouts",
    "set_collective_timeout": "timeouts",
    "UlyssesOverlap": "ulysses",
    "takes_projections": "ulysses",
    "ulysses_attention": "ulysses",
    "SKIP_ROOT_WRAP_ATTR": "unit_layout",
    "plan_units": "unit_layout",
    "usp_attention": "usp",
    "PackedLayout": "packing",
    "PackedSequence": "packing",
    "gather_packed": "packed_split",
    "packed_attention": "packed_attention",
    "split_packed": "packed_split",
}

__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
