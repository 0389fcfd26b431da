"""Training modes beyond one loss and one optimizer: each mode in a module of its own.

Fine-tuning (full or LoRA) is the plain loop (:mod:`mm_trainer.loop.engine`, :mod:`mm_trainer.model.lora`).

- ``phases``: ``training.phases``, several optimizers over disjoint sub-models with their own schedule
  and cadence; few-step distillation (DMD2: critic and generator) runs as two phases, its losses in
  mm-pipelines' ``DistributionMatchingDistillation`` (docs/DESIGN.md "Training phases"); preference
  fine-tuning (Diffusion-DPO) runs as one phase ``dpo``, its loss in mm-pipelines' ``DiffusionDPO``; reward
  fine-tuning as one phase: Flow-GRPO ``grpo`` (mm-pipelines' ``FlowGRPO``) or DiffusionNFT ``nft``
  (mm-pipelines' ``DiffusionNFT``), their rollouts and losses in mm-pipelines.
- ``rewards``: ``training.rewards``, registered scorers of samples (on decoded frames or latents, pointwise
  or groupwise) combined with weights, and ``training.reward_failure``; they score the validation clips
  (docs/DESIGN.md "Rewards").
- ``rollout_scoring``: the rewards of a reward fine-tuning's rollouts (Flow-GRPO's and DiffusionNFT's ``scorer``), decoded
  only when a reward scores frames, scored per prompt group.
- ``clip_score``: the built-in reward ``clip_score`` (a transformers ``CLIPModel`` from a local folder).
"""
