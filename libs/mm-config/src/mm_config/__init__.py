"""Pydantic schema of the six-section training YAML: load, override, validate, dump."""

__version__ = "0.1.0"

from .base import ConfigModel, DType, InputPath, ModulePattern, PartialConfigModel, keyword_schema  # noqa: E402
from .check import CheckReport, check_config, config_warnings, recheck_config  # noqa: E402
from .conversation import (  # noqa: E402
    BUILTIN_MM_PLUGINS,
    BUILTIN_TEMPLATES,
    ConversationColumnsConfig,
    ConversationDatasetConfig,
)
from .data import DataConfig, PackingConfig, SourceConfig  # noqa: E402
from .datasets import (  # noqa: E402
    PrecomputedLatentsConfig,
    VideoPairsConfig,
    VideoTextDatasetConfig,
    frame_rule_problem,
)
from .distill import DistillOptions  # noqa: E402
from .dpo import DPOOptions  # noqa: E402
from .errors import ConfigError, MissingDependencyError, Problem, RuleViolations  # noqa: E402
from .features import (  # noqa: E402
    CompileMode,
    CompilePlanConfig,
    FeaturesConfig,
    ModulePlanConfig,
    RecomputePlanConfig,
)
from .grpo import GRPOOptions  # noqa: E402
from .hf_model import ATTN_IMPLEMENTATIONS, GENERIC_TRANSFORMERS_ID, HFModelConfig  # noqa: E402
from .known_ids import (  # noqa: E402
    ID_KINDS,
    declare_ids,
    declared_ids,
    known_ids,
    register_id_provider,
    registered_name,
    undeclare_ids,
)
from .loader import (  # noqa: E402
    apply_overrides,
    config_to_data,
    config_to_yaml,
    dump_config,
    load_config,
    parse_override,
    prune_problems,
    read_yaml,
    validate_config,
    validate_with_plugins,
)
from .lora import LoraConfig  # noqa: E402
from .model import LoadFormat, ModelConfig, SubModelConfig  # noqa: E402
from .model_checks import CHECKS_ENTRY_POINT_GROUP, run_model_checks  # noqa: E402
from .nft import NFTOptions  # noqa: E402
from .parallel import FSDPPlanConfig, ParallelConfig, SubPlanConfig, UlyssesOverlapConfig  # noqa: E402
from .phases import PhaseConfig  # noqa: E402
from .preprocess import PreprocessRunConfig  # noqa: E402
from .registry import (  # noqa: E402
    ENTRY_POINT_GROUP,
    dataset_schema,
    load_schema_entry_points,
    model_schema,
    pipeline_schema,
    register_dataset_schema,
    register_model_schema,
    register_pipeline_schema,
    register_reward_schema,
    registered_ids,
    reward_schema,
    unregister_schema,
)
from .rewards import (  # noqa: E402
    ClipScoreOptions,
    ColourTargetOptions,
    DistinctnessOptions,
    RewardConfig,
    ToneTargetOptions,
    check_template,
    model_folder,
)
from .root import TrainConfig, context_ranks_per_node, replicas_across_nodes  # noqa: E402
from .tools import MemoryProfileConfig, ProfileConfig, ToolsConfig  # noqa: E402
from .training import EMAConfig, NonFiniteConfig, TrainingConfig, WandbConfig  # noqa: E402
from .validation import ValidationConfig  # noqa: E402
from .warning_policy import ALLOWED_WARNINGS, AllowedWarning, install_warning_filters  # noqa: E402

__all__ = [
    "PreprocessRunConfig",
    "ALLOWED_WARNINGS",
    "ATTN_IMPLEMENTATIONS",
    "BUILTIN_MM_PLUGINS",
    "BUILTIN_TEMPLATES",
    "CHECKS_ENTRY_POINT_GROUP",
    "ID_KINDS",
    "declare_ids",
    "declared_ids",
    "known_ids",
    "prune_problems",
    "register_id_provider",
    "registered_name",
    "run_model_checks",
    "undeclare_ids",
    "AllowedWarning",
    "install_warning_filters",
    "CheckReport",
    "CompileMode",
    "CompilePlanConfig",
    "ConfigError",
    "ConfigModel",
    "ConversationColumnsConfig",
    "ConversationDatasetConfig",
    "DType",
    "DataConfig",
    "PackingConfig",
    "SourceConfig",
    "DistillOptions",
    "DPOOptions",
    "GRPOOptions",
    "NFTOptions",
    "EMAConfig",
    "ENTRY_POINT_GROUP",
    "FSDPPlanConfig",
    "FeaturesConfig",
    "GENERIC_TRANSFORMERS_ID",
    "HFModelConfig",
    "InputPath",
    "LoadFormat",
    "LoraConfig",
    "MemoryProfileConfig",
    "MissingDependencyError",
    "ModelConfig",
    "ModulePattern",
    "ModulePlanConfig",
    "NonFiniteConfig",
    "PhaseConfig",
    "RewardConfig",
    "ColourTargetOptions",
    "ToneTargetOptions",
    "ClipScoreOptions",
    "DistinctnessOptions",
    "model_folder",
    "check_template",
    "register_reward_schema",
    "reward_schema",
    "ParallelConfig",
    "PartialConfigModel",
    "PrecomputedLatentsConfig",
    "Problem",
    "ProfileConfig",
    "RecomputePlanConfig",
    "RuleViolations",
    "SubModelConfig",
    "SubPlanConfig",
    "UlyssesOverlapConfig",
    "ToolsConfig",
    "ValidationConfig",
    "TrainConfig",
    "TrainingConfig",
    "WandbConfig",
    "VideoTextDatasetConfig",
    "VideoPairsConfig",
    "__version__",
    "apply_overrides",
    "check_config",
    "config_to_data",
    "config_to_yaml",
    "config_warnings",
    "context_ranks_per_node",
    "dataset_schema",
    "dump_config",
    "frame_rule_problem",
    "keyword_schema",
    "load_config",
    "load_schema_entry_points",
    "model_schema",
    "parse_override",
    "pipeline_schema",
    "read_yaml",
    "recheck_config",
    "register_dataset_schema",
    "register_model_schema",
    "register_pipeline_schema",
    "registered_ids",
    "replicas_across_nodes",
    "unregister_schema",
    "validate_config",
    "validate_with_plugins",
]
