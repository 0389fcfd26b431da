"""Checks before work: of the config, of the model's plan patterns, of a run at several layouts.

- ``preflight``: ``mm-config check`` as the trainer runs it first.
- ``model_checks``: the ``mm_config.checks`` entry point (``hf_config``, ``sub_models`` and ``plan_patterns`` below).
- ``hf_config``: transformers sub-models' ``config`` keys against the upstream classes.
- ``sub_models``: the container's rules on its sub-models (a distillation's architectures).
- ``plan_patterns``: every plan pattern against the model built on meta.
- ``model_set``: the container's check that the run's model files belong together (trainer, before building).
- ``lora_files``: each ``lora.init_from`` file's header against the adapters of the model built on meta
  (trainer, before any weight is read).
- ``layouts``: ``mm-train check-layouts``, the same losses at several layouts.
"""
