"""Weight loading (HF / diffusers safetensors, torch DCP), table-driven key maps, online DCP conversion,
distributed checkpointing and export."""

__version__ = "0.1.0"

from .checkpointer import DistributedCheckpointer, RNGState, checkpoint_info
from .conversion import convert_to_dcp, ensure_dcp_cache
from .errors import (
    AmbiguousCheckpointError,
    CheckpointError,
    CheckpointFormatError,
    CheckpointLoadError,
    CheckpointNotFoundError,
    KeyMapError,
)
from .export import export_checkpoint
from .formats import normalize_format, resolve_load_format, sniff_format
from .inspection import summarize, verify_checkpoints
from .key_maps import (
    WEIGHT_TRANSFORM_PIPELINES,
    ConcatRule,
    KeyMapTransform,
    KeyPlan,
    RenameRule,
    Reshape,
    SplitRule,
    Transpose,
    WeightTransform,
    get_weight_transform,
    register_weight_transform,
)
from .layout import TRACKER_FILENAME, latest_iteration, looks_like_dcp_checkpoint_dir
from .loader import LoadReport, load_checkpoint_with_conversion
from .lora_files import (
    LORA_EXPORT_FORMATS,
    PEFT_WEIGHT_NAME,
    LoraWeights,
    export_lora,
    export_merged,
    read_lora_adapters,
    save_comfy_lora,
    save_peft_lora,
)
from .module_state import materialize_meta
from .pipeline_folder import write_pipeline_folder
from .restricted_dcp import (
    RestrictedFileSystemReader,
    RestrictedLoadPlanner,
    check_dcp_storage,
    read_dcp_metadata,
    restricted_dcp_load,
)
from .source_identity import identity_change, source_identity
from .sources import CheckpointSource, resolve_checkpoint_source

__all__ = [
    "AmbiguousCheckpointError",
    "CheckpointError",
    "CheckpointFormatError",
    "CheckpointLoadError",
    "CheckpointNotFoundError",
    "CheckpointSource",
    "ConcatRule",
    "DistributedCheckpointer",
    "KeyMapError",
    "LORA_EXPORT_FORMATS",
    "KeyMapTransform",
    "KeyPlan",
    "LoadReport",
    "LoraWeights",
    "PEFT_WEIGHT_NAME",
    "RNGState",
    "RenameRule",
    "Reshape",
    "RestrictedFileSystemReader",
    "RestrictedLoadPlanner",
    "SplitRule",
    "TRACKER_FILENAME",
    "check_dcp_storage",
    "checkpoint_info",
    "Transpose",
    "WEIGHT_TRANSFORM_PIPELINES",
    "WeightTransform",
    "convert_to_dcp",
    "ensure_dcp_cache",
    "export_checkpoint",
    "export_lora",
    "export_merged",
    "get_weight_transform",
    "identity_change",
    "latest_iteration",
    "load_checkpoint_with_conversion",
    "looks_like_dcp_checkpoint_dir",
    "materialize_meta",
    "normalize_format",
    "read_dcp_metadata",
    "read_lora_adapters",
    "register_weight_transform",
    "resolve_checkpoint_source",
    "resolve_load_format",
    "restricted_dcp_load",
    "save_comfy_lora",
    "save_peft_lora",
    "sniff_format",
    "source_identity",
    "summarize",
    "verify_checkpoints",
    "write_pipeline_folder",
]
