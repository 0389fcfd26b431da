"""Training modes beyond one loss and one optimizer: each mode in a module of its own.

Fine-tuning (full or LoRA) is the plain loop (:mod:`mm_trainer.loop.engine`, :mod:`mm_trainer.model.lora`).

- ``phases``: ``training.phases``, several optimizers over disjoint sub-models with their own schedule
  and cadence; few-step distillation (DMD2: critic and generator) runs as two phases, its losses in
  mm-pipelines' ``DistributionMatchingDistillation`` (docs/DESIGN.md "Training phases"); preference
  fine-tuning (Diffusion-DPO) runs as one phase ``dpo``, its loss in mm-pipelines' ``DiffusionDPO``; reward
  fine-tuning (Flow-GRPO) as one phase ``grpo``, its rollouts and loss in mm-pipelines' ``FlowGRPO``.
- ``rewards``: ``training.rewards``, registered scorers of samples (on decoded frames or latents, pointwise
  or groupwise) combined with weights, and ``training.reward_failure``; they score the validation clips
  (docs/DESIGN.md "Rewards").
- ``rollout_scoring``: what a pipeline that samples its own rollouts is (``RolloutMode``, ``rollout_mode``:
  the one test of a ``scorer`` slot) and the rewards of its rollouts (Flow-GRPO's and DiffusionNFT's ``scorer``), decoded
  only when a reward scores frames, scored per prompt group.
- ``clip_score``: the built-in reward ``clip_score`` (a transformers ``CLIPModel`` from a local folder).
- ``policy_reference``: the sub-models a fine-tuning against a reference needs (DPO; GRPO and NFT with a KL
  term), checked from their config sections before anything is built, for every model plugin.
"""
