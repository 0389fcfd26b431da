"""The model-agnostic FSDP2 trainer: registries, model hubs and containers, features, TrainEngine, resume, metrics.

Its modules live in rooms by concern (``registry``, ``model``, ``checks``, ``data``, ``run``, ``planner``,
``loop``, ``modes``, ``tools``; the README's "Layout"); every public name is re-exported here.

The names are imported on first use (PEP 562), so ``import mm_trainer`` (and ``mm-train --help``)
imports no torch; ``from mm_trainer import Trainer`` works as before."""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    # name: module that defines it
    "preflight": "mm_trainer.checks.preflight",
    "BatchStream": "mm_trainer.data.batches",
    "build_batch_stream": "mm_trainer.data.batches",
    "build_dataset": "mm_trainer.data.batches",
    "ConditionStream": "mm_trainer.data.conditions",
    "conversation_dataset": "mm_trainer.data.conversation",
    "load_processor_parts": "mm_trainer.data.conversation",
    "FSDP_AUTO_BYTES": "mm_trainer.data.frozen_encoders",
    "enable_vae_tiling": "mm_trainer.data.frozen_encoders",
    "load_frozen": "mm_trainer.data.frozen_encoders",
    "shard_frozen": "mm_trainer.data.frozen_encoders",
    "use_text_encoder_fsdp": "mm_trainer.data.frozen_encoders",
    "weights_bytes": "mm_trainer.data.frozen_encoders",
    "preprocess_ranks": "mm_trainer.data.preprocess",
    "weights_identity": "mm_trainer.data.preprocess",
    "write_latent_cache": "mm_trainer.data.preprocess",
    "TrainEngine": "mm_trainer.loop.engine",
    "MetricsLogger": "mm_trainer.loop.metrics",
    "PEAK_FLOPS": "mm_trainer.loop.metrics",
    "NonFiniteGuard": "mm_trainer.loop.nonfinite",
    "NonFiniteLossError": "mm_trainer.loop.nonfinite",
    "state_is_finite": "mm_trainer.loop.nonfinite",
    "Validator": "mm_trainer.loop.validation",
    "BaseModel": "mm_trainer.model.base_model",
    "init_module_weights": "mm_trainer.model.base_model",
    "load_module_weights": "mm_trainer.model.base_model",
    "ModelContainer": "mm_trainer.model.container",
    "ModelContainerHub": "mm_trainer.model.container",
    "freeze": "mm_trainer.model.container",
    "ParameterEMA": "mm_trainer.model.ema",
    "FeaturesReport": "mm_trainer.model.features",
    "apply_features": "mm_trainer.model.features",
    "feature_plans": "mm_trainer.model.features",
    "plan_features": "mm_trainer.model.features",
    "fsdp_plan_from_config": "mm_trainer.model.fsdp_plan",
    "export_hf_model": "mm_trainer.model.hf_export",
    "HFModel": "mm_trainer.model.hf_model",
    "import_transformers": "mm_trainer.model.hf_model",
    "TransformersKeyRenaming": "mm_trainer.model.hf_model",
    "hf_model_class": "mm_trainer.model.hf_model",
    "ModelHub": "mm_trainer.model.hub",
    "LoraAdapters": "mm_trainer.model.lora",
    "LoraTargets": "mm_trainer.model.lora",
    "LoraFileError": "mm_trainer.model.lora",
    "load_lora_file": "mm_trainer.model.lora",
    "check_lora_file": "mm_trainer.model.lora",
    "check_lora_files": "mm_trainer.checks.lora_files",
    "build_meta_container": "mm_trainer.model.build",
    "inject_lora": "mm_trainer.model.lora",
    "SAVED_OPS": "mm_trainer.model.recompute_policy",
    "selective_recompute_contexts": "mm_trainer.model.recompute_policy",
    "check_compile": "mm_trainer.model.regional_compile",
    "registered_names": "mm_trainer.model.registered_names",
    "Phase": "mm_trainer.modes.phases",
    "PhaseSchedulers": "mm_trainer.modes.phases",
    "build_phases": "mm_trainer.modes.phases",
    "ColourTarget": "mm_trainer.modes.rewards",
    "Distinctness": "mm_trainer.modes.rewards",
    "ClipScore": "mm_trainer.modes.clip_score",
    "evenly_spaced_frames": "mm_trainer.modes.clip_score",
    "Reward": "mm_trainer.modes.rewards",
    "RewardError": "mm_trainer.modes.rewards",
    "RewardScores": "mm_trainer.modes.rewards",
    "RewardTerm": "mm_trainer.modes.rewards",
    "Rewards": "mm_trainer.modes.rewards",
    "RolloutMode": "mm_trainer.modes.rollout_scoring",
    "RolloutScorer": "mm_trainer.modes.rollout_scoring",
    "attach_rollout_scorer": "mm_trainer.modes.rollout_scoring",
    "prepare_rollout_decoding": "mm_trainer.modes.rollout_scoring",
    "rollout_mode": "mm_trainer.modes.rollout_scoring",
    "raise_on_every_rank": "mm_trainer.modes.rollout_scoring",
    "REWARD_REGISTRY": "mm_trainer.registry.registries",
    "reward_register": "mm_trainer.registry.registries",
    "import_plugins": "mm_trainer.registry.plugins",
    "DATA_REGISTRY": "mm_trainer.registry.registries",
    "MODEL_REGISTRY": "mm_trainer.registry.registries",
    "Registry": "mm_trainer.registry.registries",
    "RegistryError": "mm_trainer.registry.registries",
    "data_register": "mm_trainer.registry.registries",
    "model_register": "mm_trainer.registry.registries",
    "RunDirectory": "mm_trainer.run.directory",
    "RunDirectoryError": "mm_trainer.run.directory",
    "RunStart": "mm_trainer.run.directory",
    "holds_a_run": "mm_trainer.run.directory",
    "open_run_directory": "mm_trainer.run.directory",
    "RunLock": "mm_trainer.run.lock",
    "RunLockedError": "mm_trainer.run.lock",
    "ResumeSettingsError": "mm_trainer.run.resume_settings",
    "check_resume": "mm_trainer.run.resume_settings",
    "compare_settings": "mm_trainer.run.resume_settings",
    "keep_configured_hyperparameters": "mm_trainer.run.resume_settings",
    "refuse_dropped_tensors": "mm_trainer.run.resume_settings",
    "load_offline_config": "mm_trainer.run.saved_config",
    "load_run_config": "mm_trainer.run.saved_config",
    "preprocess_section": "mm_trainer.run.saved_config",
    "weight_sources": "mm_trainer.run.saved_config",
    "StopSignals": "mm_trainer.run.stop_signals",
    "UsageError": "mm_trainer.run.user_errors",
    "register_user_error": "mm_trainer.run.user_errors",
    "AutoencoderFit": "mm_trainer.tools.autoencoder_fit",
    "FIT_REPORT": "mm_trainer.tools.autoencoder_fit",
    "fit_autoencoder": "mm_trainer.tools.autoencoder_fit",
    "fit_or_reuse_autoencoder": "mm_trainer.tools.autoencoder_fit",
    "fit_report": "mm_trainer.tools.autoencoder_fit",
    "fit_summary": "mm_trainer.tools.autoencoder_fit",
    "latent_statistics": "mm_trainer.tools.autoencoder_fit",
    "posterior_means": "mm_trainer.tools.autoencoder_fit",
    "reconstruct": "mm_trainer.tools.autoencoder_fit",
    "save_fitted": "mm_trainer.tools.autoencoder_fit",
    "PhaseLog": "mm_trainer.tools.progress",
    "Progress": "mm_trainer.tools.progress",
    "Trainer": "mm_trainer.trainer",
    "SampledClip": "mm_trainer.model.sampled_clip",
    "TensorBoardTracker": "mm_trainer.loop.trackers",
    "Tracker": "mm_trainer.loop.trackers",
    "WandbTracker": "mm_trainer.loop.trackers",
    "as_sampled_clip": "mm_trainer.model.sampled_clip",
    "check_cache_made_as_configured": "mm_trainer.data.cache_check",
    "SampleFramesError": "mm_trainer.data.sample_check",
    "PackingError": "mm_trainer.data.sample_check",
    "check_samples": "mm_trainer.data.sample_check",
    "ModelSetError": "mm_trainer.checks.model_set",
    "check_model_set": "mm_trainer.checks.model_set",
    "check_tracker_packages": "mm_trainer.loop.trackers",
    "open_trackers": "mm_trainer.loop.trackers",
    "preprocess_recipe": "mm_trainer.data.preprocess",
    "register_preprocess_section": "mm_trainer.data.cache_check",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
