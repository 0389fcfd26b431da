"""The check a run passes first, before any process group, model or file is touched."""

from __future__ import annotations

import logging
import os

from mm_config import TrainConfig, recheck_config

from mm_trainer.model import registered_names as _registered_names  # noqa: F401 - tells mm-config the ids

logger = logging.getLogger("mm_trainer")


def preflight(config: TrainConfig, *, check_paths: bool = True) -> TrainConfig:
    """``mm-config check`` on ``config``: plugin sub-schemas, types, bounds and (``check_paths``) the
    paths the run reads. Raises :class:`mm_config.ConfigError` listing every problem; logs the
    warnings (a long run that saves nothing, unchecked plugin sections) on rank 0."""
    report = recheck_config(config, check_paths=check_paths)
    if int(os.environ.get("RANK", "0")) == 0:
        for warning in report.warnings:
            logger.warning("config warning: %s", warning)
    return report.config
