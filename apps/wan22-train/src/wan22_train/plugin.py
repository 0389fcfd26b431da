"""Importing this module registers every Wan2.2 piece with mm-trainer and mm-checkpoint.

Listed in ``training.plugin`` as ``wan22_train.plugin`` and installed as the
``mm_trainer.plugins`` entry point ``wan22``.
"""

from wan22_train import container, predictor, text_encoder, vae  # noqa: F401
