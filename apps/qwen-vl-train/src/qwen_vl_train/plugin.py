"""Importing this module registers the Qwen-VL pieces with mm-trainer, mm-data and mm-config.

Listed in ``training.plugin`` as ``qwen_vl_train.plugin`` and installed as the ``mm_trainer.plugins``
entry point ``qwen_vl``: the model ``qwen2_5_vl`` and the multimodal plugin ``qwen2_vl`` (the
Qwen2-VL media protocol, which Qwen2.5-VL keeps) and the reward ``vlm_judge`` (a Qwen2.5-VL folder asked
whether a clip shows its prompt: ``judge.py``). Datasets use the generic ``conversation`` id of mm-trainer.
"""

from qwen_vl_train import judge, mm_plugin, model  # noqa: F401
