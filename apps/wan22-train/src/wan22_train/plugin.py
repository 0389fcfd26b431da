"""Importing this module registers every Wan2.2 piece with mm-trainer, mm-checkpoint and mm-config.

Listed in ``training.plugin`` as ``wan22_train.plugin`` and installed as the
``mm_trainer.plugins`` entry point ``wan22``; the config schemas alone (no torch) are the
``mm_config.schemas`` entry point ``wan22`` (:mod:`wan22_train.config_schema`).
"""

from wan22_train import config_schema, container, data, predictor, text_encoder, vae  # noqa: F401
