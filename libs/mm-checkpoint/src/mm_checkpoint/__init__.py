"""Weight loading (HF / diffusers safetensors, ComfyUI single files, ``.pth`` state dicts, torch DCP),
table-driven key maps, online DCP conversion,
distributed checkpointing and export.

The public names below are imported on first use (PEP 562), so ``import mm_checkpoint`` and
``mm-ckpt --help`` / ``--version`` do not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    # name: submodule that defines it
    "DistributedCheckpointer": "checkpointer",
    "RNGState": "checkpointer",
    "Withdrawal": "checkpointer",
    "checkpoint_info": "checkpointer",
    "long_waits": "runtime",
    "convert_to_dcp": "conversion",
    "ensure_dcp_cache": "conversion",
    "cache_content_change": "conversion",
    "AmbiguousCheckpointError": "errors",
    "CheckpointError": "errors",
    "CheckpointFormatError": "errors",
    "CheckpointIntegrityError": "errors",
    "CHECKSUMS_FILENAME": "checksums",
    "ChecksummingWriter": "checksums",
    "read_checksums": "checksums",
    "verify_checkpoint_dir": "checksums",
    "CheckpointLoadError": "errors",
    "CheckpointNotFoundError": "errors",
    "KeyMapError": "errors",
    "ContainerCheckpointError": "errors",
    "export_checkpoint": "export",
    "export_single_file": "export",
    "EXPORT_RECORD": "export_dir",
    "ExportDestinationError": "export_dir",
    "check_destination": "export_dir",
    "export_into": "export_dir",
    "normalize_format": "formats",
    "resolve_load_format": "formats",
    "sniff_format": "formats",
    "summarize": "inspection",
    "verify_checkpoints": "inspection",
    "KEY_MAP_REGISTRY": "key_map_registry",
    "ConcatRule": "key_maps",
    "KeyMapTransform": "key_maps",
    "KeyPlan": "key_maps",
    "RenameRule": "key_maps",
    "Reshape": "key_maps",
    "SplitRule": "key_maps",
    "Transpose": "key_maps",
    "WeightTransform": "key_maps",
    "get_weight_transform": "key_map_registry",
    "known_model_types": "key_map_registry",
    "register_weight_transform": "key_map_registry",
    "TRACKER_FILENAME": "layout",
    "latest_iteration": "layout",
    "looks_like_dcp_checkpoint_dir": "layout",
    "LoadReport": "loader",
    "load_checkpoint_with_conversion": "conversion",
    "builtin_model_types": "model_key_maps",
    "template_rule": "model_key_maps",
    "LORA_EXPORT_FORMATS": "formats",
    "PEFT_WEIGHT_NAME": "lora_files",
    "LoraWeights": "lora_files",
    "export_lora": "lora_files",
    "export_merged": "lora_files",
    "read_lora_adapters": "lora_files",
    "read_lora_file": "lora_files",
    "read_lora_file_shapes": "lora_files",
    "save_comfy_lora": "lora_files",
    "save_peft_lora": "lora_files",
    "materialize_meta": "module_state",
    "write_pipeline_folder": "pipeline_folder",
    "RestrictedFileSystemReader": "restricted_dcp",
    "RestrictedLoadPlanner": "restricted_dcp",
    "check_dcp_storage": "restricted_dcp",
    "read_dcp_metadata": "restricted_dcp",
    "restricted_dcp_load": "restricted_dcp",
    "save_safetensors": "safetensors_io",
    "identity_change": "source_identity",
    "source_identity": "source_identity",
    "CheckpointSource": "sources",
    "resolve_checkpoint_source": "sources",
    "PthReader": "pth_io",
    "load_pth_state": "pth_io",
    "ComfyFileView": "comfy_files",
    "RegroupTransform": "regroup",
    "SequenceRegroup": "regroup",
    "open_weights": "weight_readers",
    "remove_stale_temporaries": "stage_temporaries",
    "StagedCopy": "staging",
    "stage_on_node": "staging",
    "staged_location": "staging",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
