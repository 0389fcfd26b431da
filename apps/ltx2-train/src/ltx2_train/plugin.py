"""Importing this module registers the LTX-2 pieces with mm-trainer and mm-config.

Listed in ``training.plugin`` as ``ltx2_train.plugin`` and installed as the ``mm_trainer.plugins``
entry point ``ltx2``: the ``ltx2_predictor`` model (with its pipeline), the ``ltx2_container``
(several transformers: distillation) and the ``ltx2_precomputed`` dataset. Their config schemas alone (no torch) are the ``mm_config.schemas``
entry point ``ltx2`` (:mod:`ltx2_train.config_schema`).
"""

from ltx2_train import config_schema, container, data, predictor  # noqa: F401
