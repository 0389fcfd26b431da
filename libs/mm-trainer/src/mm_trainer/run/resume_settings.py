"""A resume against the settings its checkpoint was trained with.

A run that continues from a checkpoint (its own save dir, or ``training.load``) compares its config with
the config the checkpoint's run saved beside it (``config.yaml``, :data:`mm_trainer.run.saved_config.RUN_CONFIG_NAME`):

- **Refused** when changed, naming both values: what the checkpoint's tensors are, i.e. which model
  (``model_id``, ``container_id``, the sub-models present, their ``freeze``), its shape
  (``model[.models.<name>].config``), its LoRA adapters (``lora``: targets, rank, alpha; narrower
  targets also name the trained layers they would drop), which sub-models train
  (``training.trainable_submodels``), the plugin modules that define them (``training.plugin``), the
  data order the saved position counts in (``training.seed``), and whether an EMA is kept
  (``training.ema`` set or not; its ``decay`` may change).
- **Applied** otherwise, each change logged at start as ``changed on resume: <key>: <old> -> <new>``:
  the optimizer (lr, betas, eps, weight decay), the LR schedule (kind, warmup, min lr, ``train_iters``),
  clipping, intervals, the layout, the data and pipeline options, paths. Most of these are read from the
  config on every step anyway; the optimizer's hyperparameters and the schedule's base lr, which the
  checkpoint's optimizer and scheduler state would otherwise bring back, are put back to the config's
  after the load (:func:`keep_configured_hyperparameters`), while the optimizer's moments and the
  schedule's step count come from the checkpoint.

Whatever the saved config says, a checkpoint holding trained tensors that the model being resumed does
not have (a sub-model or an adapter left out) is refused too (:func:`refuse_dropped_tensors`): DCP loads
only the keys it is asked for, so they would be dropped without a word.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from mm_checkpoint import read_dcp_metadata
from mm_checkpoint.layout import resolve_dcp_dir
from mm_config import TrainConfig, config_to_data, read_yaml
from mm_parallel import pattern_matches

from mm_trainer.run.saved_config import RUN_CONFIG_NAME


class ResumeSettingsError(ValueError):
    """A resume changes a setting that defines what the checkpoint trained, or would drop its tensors."""


FIXED_MODEL_LEAVES = ("model_id", "container_id", "freeze")
"""Keys of ``model`` / ``model.models.<name>`` that say which model the checkpoint is."""
FIXED_MODEL_SECTIONS = ("config", "lora")
"""Sections of ``model`` / ``model.models.<name>`` whose every key shapes the checkpoint's tensors."""
FIXED_TRAINING_KEYS = ("training.seed", "training.plugin", "training.trainable_submodels")
"""``training`` keys that say what was trained and in which order."""


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(_flatten(value, path + "."))
        else:
            out[path] = value
    return out


def _fixed(key: str) -> bool:
    """Whether the dotted ``key`` names a setting that may not change on resume."""
    if key in FIXED_TRAINING_KEYS:
        return True
    parts = key.split(".")
    if parts[0] != "model":
        return False
    rest = parts[3:] if parts[1:2] == ["models"] else parts[1:]  # inside model.models.<name>, or model
    return bool(rest) and (
        rest[0] in FIXED_MODEL_SECTIONS or (len(rest) == 1 and rest[0] in FIXED_MODEL_LEAVES)
    )


def compare_settings(saved: Mapping[str, Any], current: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """``(refused, applied)``: the differences of two configs as plain data, one line each
    (``key: old -> new``), split by :func:`_fixed`; an EMA switched on or off is refused."""
    old, new = _flatten(saved), _flatten(current)
    refused, applied = [], []
    for key in sorted(old.keys() | new.keys()):
        before, after = old.get(key), new.get(key)
        if before == after:
            continue
        line = f"{key}: {before!r} -> {after!r}"
        ema_switched = key.startswith("training.ema") and (before is None or after is None)
        (refused if _fixed(key) or ema_switched else applied).append(line)
    return refused, applied


def saved_config(root: str | Path) -> dict[str, Any] | None:
    """The config a run saved beside its checkpoints in ``root`` (plain data), None when it has none."""
    path = Path(root) / RUN_CONFIG_NAME
    return read_yaml(path) if path.is_file() else None


def adapter_layers(keys: Sequence[str]) -> dict[str, set[str]]:
    """Sub-model name -> paths of its LoRA-adapted layers, from model state-dict keys
    (``predictor.blocks.0.fc1.lora_A.default.weight`` -> ``predictor``: ``blocks.0.fc1``)."""
    layers: dict[str, set[str]] = {}
    for key in keys:
        if ".lora_A." in key:
            sub, _, path = key.split(".lora_A.", 1)[0].partition(".")
            layers.setdefault(sub, set()).add(path)
    return layers


def _dropped_adapters(
    saved: Mapping[str, Any], current: TrainConfig, root: str | Path
) -> dict[str, list[str]]:
    """Trained adapter layers of the checkpoint in ``root`` that the current ``lora.target_modules``
    no longer match, by sub-model."""
    metadata = read_dcp_metadata(resolve_dcp_dir(root)[0])
    keys = [k[len("model.") :] for k in metadata.state_dict_metadata if k.startswith("model.")]
    dropped = {}
    subs = current.model.sub_models()
    for sub, paths in adapter_layers(keys).items():
        lora = subs[sub].lora if sub in subs else None
        patterns = lora.target_modules if lora is not None else []
        lost = sorted(p for p in paths if not any(pattern_matches(t, p) for t in patterns))
        if lost:
            dropped[sub] = lost
    return dropped


def check_resume(config: TrainConfig, resume_from: str | Path | None) -> list[str]:
    """The start-of-run check: :func:`check_resume_settings` when the run resumes ``resume_from``; with
    nothing to resume, ``training.reset_data_position`` is refused (it would do nothing)."""
    if resume_from is None:
        if config.training.reset_data_position:
            raise ResumeSettingsError(
                "training.reset_data_position: true, but this run resumes nothing (training.save holds no "
                "checkpoint and training.load is unset): it would do nothing; leave it out"
            )
        return []
    return check_resume_settings(config, resume_from)


def check_resume_settings(config: TrainConfig, root: str | Path) -> list[str]:
    """Compare ``config`` with the config saved in the checkpoint root ``root``; return the lines to log
    (``changed on resume: ...``), or raise :class:`ResumeSettingsError` listing every refused change
    (narrower LoRA targets name the trained layers they would drop). A root without a saved config
    (written by another tool) gets one line saying nothing could be compared."""
    saved = saved_config(root)
    if saved is None:
        return [f"changed on resume: not checked ({Path(root) / RUN_CONFIG_NAME} not found)"]
    refused, applied = compare_settings(saved, config_to_data(config))
    if refused:
        dropped = _dropped_adapters(saved, config, root)
        lines = [*refused, *(f"the checkpoint's trained adapters of {sub} that no target matches any more: "
                             f"{', '.join(f'{sub}.{p}' for p in paths)}" for sub, paths in dropped.items())]  # fmt: skip
        raise ResumeSettingsError(
            f"resuming {root} with settings that change what it trained (saved in {Path(root) / RUN_CONFIG_NAME} "
            "-> this run's):\n  "
            + "\n  ".join(lines)
            + "\nThese define the checkpoint's tensors and the data "
            "order: resume with the saved values, or start a new run (another training.save) from the "
            "pretrained weights"
        )
    return [f"changed on resume: {line}" for line in applied]


def refuse_dropped_tensors(model: torch.nn.Module, root: str | Path) -> None:
    """Refuse a checkpoint whose ``model`` entry holds tensors ``model`` would not load (DCP reads only
    the keys asked for), naming them by layer."""
    metadata = read_dcp_metadata(resolve_dcp_dir(root)[0])
    stored = {k[len("model.") :] for k in metadata.state_dict_metadata if k.startswith("model.")}
    extra = sorted(stored - set(model.state_dict().keys()))
    if extra:
        layers = sorted({k.rsplit(".", 1)[0].split(".lora_", 1)[0] for k in extra})
        raise ResumeSettingsError(
            f"checkpoint {root} holds trained tensors this model does not have ({len(extra)}: e.g. "
            f"{', '.join(extra[:4])}); resuming would drop the layers {', '.join(layers[:20])}"
            + (f" and {len(layers) - 20} more" if len(layers) > 20 else "")
        )


@contextlib.contextmanager
def keep_configured_hyperparameters(optimizer: torch.optim.Optimizer, lr_scheduler: Any) -> Iterator[None]:
    """Around a checkpoint load: keep the optimizer's param-group hyperparameters (lr, betas, eps, weight
    decay...) and the schedule's base lrs as the config built them, while the optimizer's state (moments,
    step counts) and the schedule's position come from the checkpoint. Then set each group's lr for the
    schedule's current step, as the schedule would have."""
    groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    base_lrs = list(getattr(lr_scheduler, "base_lrs", []))
    yield
    if len(groups) != len(optimizer.param_groups):
        raise ResumeSettingsError(
            f"the checkpoint's optimizer has {len(optimizer.param_groups)} parameter groups, this run's {len(groups)}"
        )
    for group, configured in zip(optimizer.param_groups, groups):
        group.update(configured)
    lambdas = getattr(
        lr_scheduler, "lr_lambdas", None
    )  # a LambdaLR (mm_trainer.model.optim.build_lr_scheduler)
    if base_lrs and lambdas:
        lr_scheduler.base_lrs = base_lrs
        step = lr_scheduler.last_epoch
        lrs = [base * fn(step) for base, fn in zip(base_lrs, lambdas)]
        for group, lr in zip(optimizer.param_groups, lrs):
            group["lr"] = lr
        lr_scheduler._last_lr = lrs


__all__ = [
    "ResumeSettingsError",
    "adapter_layers",
    "check_resume",
    "check_resume_settings",
    "compare_settings",
    "keep_configured_hyperparameters",
    "refuse_dropped_tensors",
    "saved_config",
]
