"""What a model is to the trainer, and what the build order makes of it (docs/DESIGN.md "The model
contract", "Build order").

The contract:

- ``base_model``: ``BaseModel``, the two-phase life cycle of a sub-model (structure, then weights).
- ``hub``: ``ModelHub``, one sub-model built from its section, on meta or with weights.
- ``container``: ``ModelContainer`` / ``ModelContainerHub``, several sub-models trained as one.
- ``sampled_clip``: ``SampledClip``, what a container's ``sample`` hook returns (a clip and its audio).
- ``hf_model``, ``hf_export``: the transformers path (``HFModel``, single-model form) and its export.
- ``registered_names``: what the registries hold, told to ``mm-config check``.

The build:

- ``build``: the build steps shared by the trainer and the planner (container -> LoRA -> context
  parallel -> features -> FSDP plan -> materialize; EMA; optimizer and schedule).
- ``weight_staging``: ``training.stage_dir``, node-local copies of the weights.
- ``lora``: peft adapters injected on matched ``nn.Linear`` modules.
- ``features``, ``regional_compile``, ``recompute_policy``: compile, recompute and activation offload,
  applied before ``fully_shard``.
- ``fsdp_plan``: the one conversion from ``parallel.fsdp_plan`` to mm-parallel's ``FSDPPlan``.
- ``ema``: the exponential moving average of the trainable parameters, on their shards.
- ``optim``: AdamW and the learning-rate schedule.
"""
