"""What the trainer reads: batches, conditions ahead, built-in datasets, the encoder cache's runs.

- ``batches``: ``BatchStream``, a registered dataset behind mm-data's resumable, layout-free loader
  (built-in ids ``video_text``, ``precomputed_latents``; ``conversation`` in ``conversation``).
- ``conditions``: ``ConditionStream`` (``features.condition_micro_steps``).
- ``preprocess``, ``frozen_encoders``: what the apps' ``preprocess`` commands share (docs/DESIGN.md
  "Latent cache").
- ``cache_check``: a training run's check that its encoder cache was made as its preprocess section says.
- ``sample_check``: a run's check, before any weight is read, that every sample fits
  ``data.packing.token_budget`` and has a frame count the pipeline can train.
"""
