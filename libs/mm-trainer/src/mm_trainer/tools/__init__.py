"""Tools beside a run: the config's ``tools`` section, plots, and tiny model sets.

- ``profiling``: ``tools.profile`` and ``tools.memory_profile``, traced step ranges.
- ``plot``: ``mm-train plot``, a PNG of a run's ``metrics.jsonl``.
- ``autoencoder_fit``: a diffusers VAE fitted to a handful of clips (the apps' ``make-tiny``).
- ``progress``: the progress of long steps outside training (the planner's trace, a dry run, a VAE
  fit): a bar on a terminal, plain lines with rate and time left otherwise.
"""
