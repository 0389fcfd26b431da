"""What plugins fill, and how plugins are found (the lowest room: it imports no other).

- ``registries``: ``MODEL_REGISTRY`` (sub-models and containers), ``DATA_REGISTRY`` (datasets) and
  ``REWARD_REGISTRY`` (reward scorers), filled by ``@model_register`` / ``@data_register`` /
  ``@reward_register`` at a plugin's import.
- ``plugins``: import the modules of ``training.plugin`` and the installed ``mm_trainer.plugins``
  entry points (the latter on a registry miss).
"""
