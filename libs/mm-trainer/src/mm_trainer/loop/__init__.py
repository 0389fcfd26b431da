"""The training loop and what runs inside it.

- ``engine``: ``TrainEngine``, optimizer steps with accumulation, clipping, saves and stop requests.
- ``metrics``: the progress bar or log lines, ``metrics.jsonl``, MFU; the trackers it feeds:
- ``trackers``: TensorBoard (``training.tensorboard``) and Weights & Biases (``training.wandb``).
- ``nonfinite``: non-finite steps skipped, named and never checkpointed.
- ``validation``: ``training.validation`` (sampled clips, held-out loss).
- ``seeding``: the global RNGs' seeding (draws that change the loss are keyed: mm-pipelines' ``SampleRNG``).
- ``plan_check``: the planner's peak against the measured one, on accelerators.
"""
