"""The model-agnostic FSDP2 trainer: registries, model hubs and containers, features, TrainEngine, resume, metrics.

Its modules live in rooms by concern (``registry``, ``model``, ``checks``, ``data``, ``run``, ``planner``,
``loop``, ``modes``, ``tools``; the README's "Layout"); every public name is re-exported here."""

__version__ = "0.1.0"

from mm_trainer.checks.preflight import preflight  # noqa: E402
from mm_trainer.data.batches import BatchStream, build_batch_stream, build_dataset  # noqa: E402
from mm_trainer.data.cache_check import check_cache_made_as_configured, register_preprocess_section  # noqa: E402
from mm_trainer.data.conditions import ConditionStream  # noqa: E402
from mm_trainer.data.conversation import conversation_dataset  # noqa: E402
from mm_trainer.data.frozen_encoders import (  # noqa: E402
    FSDP_AUTO_BYTES,
    enable_vae_tiling,
    load_frozen,
    shard_frozen,
    use_text_encoder_fsdp,
    weights_bytes,
)
from mm_trainer.data.preprocess import (  # noqa: E402
    preprocess_ranks,
    preprocess_recipe,
    weights_identity,
    write_latent_cache,
)
from mm_trainer.loop.engine import TrainEngine  # noqa: E402
from mm_trainer.loop.metrics import PEAK_FLOPS, MetricsLogger  # noqa: E402
from mm_trainer.loop.nonfinite import NonFiniteGuard, NonFiniteLossError, state_is_finite  # noqa: E402
from mm_trainer.loop.trackers import (  # noqa: E402
    TensorBoardTracker,
    Tracker,
    WandbTracker,
    check_tracker_packages,
    open_trackers,
)
from mm_trainer.loop.validation import Validator  # noqa: E402
from mm_trainer.model.base_model import BaseModel, init_module_weights, load_module_weights  # noqa: E402
from mm_trainer.model.container import ModelContainer, ModelContainerHub, freeze  # noqa: E402
from mm_trainer.model.ema import ParameterEMA  # noqa: E402
from mm_trainer.model.features import FeaturesReport, apply_features, feature_plans, plan_features  # noqa: E402
from mm_trainer.model.fsdp_plan import fsdp_plan_from_config  # noqa: E402
from mm_trainer.model.hf_export import export_hf_model  # noqa: E402
from mm_trainer.model.hf_model import HFModel, TransformersKeyRenaming, hf_model_class  # noqa: E402
from mm_trainer.model.hub import ModelHub  # noqa: E402
from mm_trainer.model.lora import LoraAdapters, LoraTargets, inject_lora  # noqa: E402
from mm_trainer.model.recompute_policy import SAVED_OPS, selective_recompute_contexts  # noqa: E402
from mm_trainer.model.regional_compile import check_compile  # noqa: E402
from mm_trainer.model.registered_names import registered_names  # noqa: E402
from mm_trainer.model.sampled_clip import SampledClip, as_sampled_clip  # noqa: E402
from mm_trainer.modes.phases import Phase, PhaseSchedulers, build_phases  # noqa: E402
from mm_trainer.registry.plugins import import_plugins  # noqa: E402
from mm_trainer.registry.registries import (  # noqa: E402
    DATA_REGISTRY,
    MODEL_REGISTRY,
    Registry,
    RegistryError,
    data_register,
    model_register,
)
from mm_trainer.run.directory import (  # noqa: E402
    RunDirectory,
    RunDirectoryError,
    RunStart,
    holds_a_run,
    open_run_directory,
)
from mm_trainer.run.lock import RunLock, RunLockedError  # noqa: E402
from mm_trainer.run.resume_settings import (  # noqa: E402
    ResumeSettingsError,
    check_resume,
    compare_settings,
    keep_configured_hyperparameters,
    refuse_dropped_tensors,
)
from mm_trainer.run.saved_config import (  # noqa: E402
    load_offline_config,
    load_run_config,
    preprocess_section,
    weight_sources,
)
from mm_trainer.run.stop_signals import StopSignals  # noqa: E402
from mm_trainer.tools.autoencoder_fit import (  # noqa: E402
    FIT_REPORT,
    AutoencoderFit,
    fit_autoencoder,
    fit_or_reuse_autoencoder,
    fit_report,
    fit_summary,
    latent_statistics,
    posterior_means,
    reconstruct,
    save_fitted,
)
from mm_trainer.trainer import Trainer  # noqa: E402

__all__ = [
    "SAVED_OPS",
    "DATA_REGISTRY",
    "MODEL_REGISTRY",
    "FIT_REPORT",
    "PEAK_FLOPS",
    "AutoencoderFit",
    "BaseModel",
    "BatchStream",
    "ConditionStream",
    "FeaturesReport",
    "HFModel",
    "LoraAdapters",
    "LoraTargets",
    "MetricsLogger",
    "SampledClip",
    "TensorBoardTracker",
    "Tracker",
    "WandbTracker",
    "as_sampled_clip",
    "check_tracker_packages",
    "open_trackers",
    "ModelContainer",
    "ModelContainerHub",
    "ModelHub",
    "NonFiniteGuard",
    "NonFiniteLossError",
    "ParameterEMA",
    "Phase",
    "PhaseSchedulers",
    "build_phases",
    "Registry",
    "RegistryError",
    "RunDirectory",
    "RunDirectoryError",
    "ResumeSettingsError",
    "RunLock",
    "RunLockedError",
    "RunStart",
    "StopSignals",
    "TrainEngine",
    "TransformersKeyRenaming",
    "Trainer",
    "Validator",
    "apply_features",
    "check_compile",
    "check_resume",
    "compare_settings",
    "holds_a_run",
    "keep_configured_hyperparameters",
    "refuse_dropped_tensors",
    "state_is_finite",
    "weight_sources",
    "feature_plans",
    "plan_features",
    "selective_recompute_contexts",
    "build_batch_stream",
    "build_dataset",
    "conversation_dataset",
    "export_hf_model",
    "data_register",
    "fit_autoencoder",
    "fit_or_reuse_autoencoder",
    "fit_report",
    "fit_summary",
    "freeze",
    "hf_model_class",
    "fsdp_plan_from_config",
    "import_plugins",
    "inject_lora",
    "init_module_weights",
    "latent_statistics",
    "load_module_weights",
    "load_offline_config",
    "load_run_config",
    "preprocess_section",
    "FSDP_AUTO_BYTES",
    "enable_vae_tiling",
    "load_frozen",
    "preprocess_ranks",
    "preprocess_recipe",
    "check_cache_made_as_configured",
    "register_preprocess_section",
    "shard_frozen",
    "use_text_encoder_fsdp",
    "weights_bytes",
    "weights_identity",
    "write_latent_cache",
    "model_register",
    "open_run_directory",
    "preflight",
    "registered_names",
    "posterior_means",
    "reconstruct",
    "save_fitted",
]
