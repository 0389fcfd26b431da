"""Pydantic schema of the six-section training YAML: load, override, validate, dump."""

__version__ = "0.1.0"

from .base import ConfigModel, DType, ModulePattern  # noqa: E402
from .conversation import ConversationColumnsConfig, ConversationDatasetConfig  # noqa: E402
from .data import DataConfig  # noqa: E402
from .errors import ConfigError, Problem, RuleViolations  # noqa: E402
from .features import FeaturesConfig, ModulePlanConfig  # noqa: E402
from .hf_model import HFModelConfig  # noqa: E402
from .loader import (  # noqa: E402
    apply_overrides,
    config_to_yaml,
    dump_config,
    load_config,
    parse_override,
    read_yaml,
    validate_config,
)
from .lora import LoraConfig  # noqa: E402
from .model import ModelConfig, SubModelConfig  # noqa: E402
from .parallel import FSDPPlanConfig, ParallelConfig, SubPlanConfig  # noqa: E402
from .registry import (  # noqa: E402
    dataset_schema,
    model_schema,
    register_dataset_schema,
    register_model_schema,
    unregister_schema,
)
from .root import TrainConfig  # noqa: E402
from .tools import MemoryProfileConfig, ProfileConfig, ToolsConfig  # noqa: E402
from .training import NonFiniteConfig, TrainingConfig  # noqa: E402

__all__ = [
    "ConfigError",
    "ConfigModel",
    "ConversationColumnsConfig",
    "ConversationDatasetConfig",
    "DType",
    "DataConfig",
    "FSDPPlanConfig",
    "FeaturesConfig",
    "HFModelConfig",
    "LoraConfig",
    "MemoryProfileConfig",
    "ModelConfig",
    "ModulePattern",
    "ModulePlanConfig",
    "NonFiniteConfig",
    "ParallelConfig",
    "Problem",
    "ProfileConfig",
    "RuleViolations",
    "SubModelConfig",
    "SubPlanConfig",
    "ToolsConfig",
    "TrainConfig",
    "TrainingConfig",
    "__version__",
    "apply_overrides",
    "config_to_yaml",
    "dataset_schema",
    "dump_config",
    "load_config",
    "model_schema",
    "parse_override",
    "read_yaml",
    "register_dataset_schema",
    "register_model_schema",
    "unregister_schema",
    "validate_config",
]
