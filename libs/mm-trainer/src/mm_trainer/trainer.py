"""Trainer: assembles a run in the order of docs/DESIGN.md "Build order".

config (the config check, paths included) -> init distributed + ParallelState -> import plugins
 -> checks before any weight is read: model set, LoRA files (lora.init_from), encoder cache, samples
 -> build model (ModelHub / ModelContainerHub; meta where asked)
 -> LoRA adapters (model.models.<name>.lora: peft layers around the matched nn.Linear)
 -> context parallel hooks, features (compile, recompute, activation offload)   # BEFORE fully_shard
 -> FSDP2 plan                                                       # DTensor layout on meta
 -> materialize (to_empty) + load weights                            # AFTER fully_shard
 -> random init only for sub-models that loaded nothing; LoRA adapters initialized (B = 0)
 -> EMA of the trainable parameters (training.ema; on their shards)
 -> optimizer, lr scheduler, batches (+ conditions ahead: features.condition_micro_steps), checkpointer (resume)
 -> rewards (training.rewards): the scorer of a reward fine-tuning's rollouts, validation's
 -> validator (training.validation: the model's sample / validation_loss hooks, held-out data)
 -> TrainEngine.train
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from mm_checkpoint import CheckpointIntegrityError, DistributedCheckpointer, long_waits
from mm_config import TrainConfig
from mm_parallel import (
    NodeLayout,
    describe_node_layout,
    get_local_device,
    init_distributed,
    new_long_wait_group,
    use_attention_backend,
)
from torch import nn

from mm_trainer.checks.lora_files import check_lora_files
from mm_trainer.checks.model_set import check_model_set
from mm_trainer.checks.preflight import preflight
from mm_trainer.data.batches import BatchStream, build_batch_stream
from mm_trainer.data.cache_check import check_cache_made_as_configured
from mm_trainer.data.conditions import ConditionStream
from mm_trainer.data.sample_check import check_samples
from mm_trainer.loop.engine import TrainEngine
from mm_trainer.loop.metrics import MetricsLogger, peak_memory_bytes
from mm_trainer.loop.plan_check import PlanCheck
from mm_trainer.loop.seeding import seed_everything
from mm_trainer.loop.trackers import check_tracker_packages
from mm_trainer.loop.validation import Validator
from mm_trainer.model.base_model import init_module_weights, load_module_weights
from mm_trainer.model.build import (
    build_ema,
    build_optimization,
    build_sharded_model,
    log_rank0,
    materialize,
    parallel_state_for,
)
from mm_trainer.model.regional_compile import check_compile
from mm_trainer.model.weight_staging import stage_model_weights
from mm_trainer.modes.phases import PhaseSchedulers, build_phases, keep_configured_phase_hyperparameters
from mm_trainer.modes.rewards import Rewards
from mm_trainer.modes.rollout_scoring import attach_rollout_scorer, prepare_rollout_decoding
from mm_trainer.registry.plugins import import_plugins
from mm_trainer.run.checkpoint_saves import CheckpointSaves
from mm_trainer.run.directory import open_run_directory
from mm_trainer.run.resume_settings import (
    check_resume,
    keep_configured_hyperparameters,
    refuse_dropped_tensors,
)
from mm_trainer.tools.profiling import MemoryProfiler, StepProfiler

logger = logging.getLogger("mm_trainer")


class Trainer:
    """Builds everything a run needs from a validated :class:`mm_config.TrainConfig`, then trains."""

    def __init__(self, config: TrainConfig, *, prune_kept_checkpoints: bool = False) -> None:
        """``prune_kept_checkpoints`` (``--prune-kept-checkpoints``): let ``keep_last`` / ``keep_every``
        delete checkpoints that the retention they were saved under keeps (see
        :class:`mm_checkpoint.DistributedCheckpointer`, ``prune_kept``)."""
        self.prune_kept_checkpoints = prune_kept_checkpoints
        self.config = config = preflight(config)
        check_tracker_packages(config.training)  # a missing tracker package fails before anything is built
        device_type = config.training.device
        timeout_s = config.training.collective_timeout_s
        self.rank, self.world_size = init_distributed(device_type=device_type, timeout_s=timeout_s)
        # waits for one rank's long work (staging, conversion, async saves): their own timeout
        self.long_wait_group = new_long_wait_group(config.training.long_wait_timeout_s)
        parallel = config.parallel
        self.parallel_state = parallel_state_for(config, self.world_size, device_type)
        nodes = NodeLayout.from_env(self.world_size)  # refuses nodes that run different numbers of ranks
        if nodes.num_nodes > 1:
            log_rank0(describe_node_layout(self.parallel_state.rank_groups(), nodes))
        self.device = get_local_device(device_type)
        # accelerators: `mm-train plan` of this run in the background, compared after the first step
        self.plan_check = PlanCheck.start(
            config, rank=self.rank, world_size=self.world_size, device_type=self.device.type
        )
        if parallel.ring_attention_size > 1:  # the ring's block kernel (before any model is built)
            log_rank0(
                f"ring attention kernel: {use_attention_backend(parallel.attention_backend, self.device)}"
            )
        # Lock the save / log dirs for this run and decide where it starts (training.resume).
        self.run_dir = open_run_directory(config.training)
        # Settings that define what the checkpoint trained must match it; the others apply, logged.
        for line in check_resume(config, self.run_dir.resume_from):
            log_rank0(line)
        import_plugins(config.training.plugin)
        # model files that do not belong together (the container class says which): refused, nothing built
        check_model_set(config)
        # a LoRA file (lora.init_from) of another model or release: refused from its header, no weight read
        check_lora_files(config)
        # an encoder cache made otherwise than data.dataset.preprocess says: refused before any model loads
        check_cache_made_as_configured(config.data)
        # a sample above data.packing.token_budget, or of a frame count the pipeline refuses (meta container)
        check_samples(config)
        seed_everything(config.training.seed)
        if config.training.deterministic:
            torch.use_deterministic_algorithms(True)
        with long_waits(self.long_wait_group):
            self.model = self._build_model()
        self.ema = build_ema(self.model, config.training)
        # No reseeding by rank: training draws are keyed by (seed, step, sample), see TrainEngine.
        self.phases = build_phases(self.model, config.training, self.device.type)  # training.phases
        if self.phases:  # the checkpoint's optimizer / lr_scheduler entries hold every phase's
            self.optimizer, self.lr_scheduler = (
                [p.optimizer for p in self.phases],
                PhaseSchedulers(self.phases),
            )
        else:
            self.optimizer, self.lr_scheduler = build_optimization(
                self.model, config.training, self.device.type
            )
        self.batches: BatchStream | ConditionStream = build_batch_stream(
            config.data,
            global_batch_size=config.training.global_batch_size,
            micro_batch_size=config.training.micro_batch_size,
            dp_rank=self.parallel_state.dp_rank,
            dp_size=self.parallel_state.dp_size,
            seed=config.training.seed,
            sample_tokens=getattr(self.model, "packing_tokens", None),  # data.packing
        )
        if config.features.condition_micro_steps > 1:
            ps = self.parallel_state
            self.batches = ConditionStream(
                self.batches,
                self.model.encode_conditions,
                micro_steps=config.features.condition_micro_steps,
                device=self.device,
                cp_group=ps.cp_group if ps.cp_enabled else None,
            )
        self.saves = self._saves() if config.training.save else None
        self.start_iteration = self._resume() if self.run_dir.resume_from else 0
        self.rewards = Rewards.from_config(
            config.training.rewards, on_failure=config.training.reward_failure, device=self.device
        )
        prepare_rollout_decoding(self.model, self.rewards, data=config.data, device=self.device)
        attach_rollout_scorer(self.model, self.rewards)  # model.pipeline.grpo / nft: rollouts' rewards
        self.validator = self._validator() if config.training.validation else None

    # ------------------------------------------------------------ building
    def _build_model(self) -> nn.Module:
        cfg = self.config
        if cfg.features.compile.apply_modules:  # before any weight is read
            check_compile(cfg.features.compile.backend, cfg.features.compile.mode, self.device.type)
        # training.stage_dir: read the weights from node-local copies (the saved config keeps the sources)
        model_cfg = (
            stage_model_weights(cfg.model, cfg.training.stage_dir) if cfg.training.stage_dir else cfg.model
        )
        # container -> LoRA -> CP hooks -> features -> FSDP plan: mm_trainer.model.build (the planner's path too)
        sharded = build_sharded_model(cfg, self.parallel_state, self.device, model_section=model_cfg)
        model, self.lora, self.fsdp_report = sharded.model, sharded.lora, sharded.fsdp
        resuming = self.run_dir.resume_from is not None
        sub_model_args = model_cfg.sub_models()
        for name, module in model.sub_models().items():
            # A LoRA sub-model's checkpoint holds its adapters only: its base always loads from the source.
            restored_by_checkpoint = (
                resuming and name in model.checkpoint_submodels and name not in model.partial_checkpoints
            )
            with self.lora.base_names(name, module):
                self._materialize_and_load(name, module, sub_model_args[name], restored_by_checkpoint)
        self.lora.init_adapters(model, cfg.training.seed)  # a resume then restores them
        for line in self.lora.summary(model):
            log_rank0(line)
        return model

    def _validator(self) -> Validator:
        cfg, ps = self.config, self.parallel_state
        return Validator(
            self.model,
            cfg.training.validation,
            data=cfg.data,
            seed=cfg.training.seed,
            out_dir=cfg.training.log_dir or cfg.training.save,
            device=self.device,
            dp_rank=ps.dp_rank,
            dp_size=ps.dp_size,
            dp_group=ps.dp_group,
            write=self.rank == 0,
            rewards=self.rewards,
        )

    def _materialize_and_load(self, name: str, module: nn.Module, args: Any, restored: bool) -> None:
        was_meta = any(p.is_meta for p in module.parameters())
        if was_meta:
            materialize(name, module, self.device)
        if restored or getattr(module, "weights_loaded", False):
            return
        setup = getattr(module, "setup_weights", None)
        report = setup(args) if callable(setup) else load_module_weights(module, args)
        if report is not None:
            module.weights_loaded = True
            return
        if was_meta:
            log_rank0(f"model.models.{name}: no weights source; random initialization")
            init = getattr(module, "random_init", None)
            init() if callable(init) else init_module_weights(module)

    def _saves(self) -> CheckpointSaves:
        ps = self.parallel_state
        return CheckpointSaves(
            self.config, self.state, submodels=self.model.checkpoint_submodels, dp_rank=ps.dp_rank,
            dp_size=ps.dp_size, rank=self.rank, background_group=self.long_wait_group,
            prune_kept=self.prune_kept_checkpoints,
        )  # fmt: skip

    # ------------------------------------------------------------- running
    def state(self) -> dict[str, Any]:
        """What a checkpoint holds: model, optimizer, scheduler, the EMA (``training.ema``), the data
        position and, for a pipeline with a state of its own (``state_dict``: DiffusionNFT's old policy), that
        state per data-parallel rank. All of it loads at any layout; no RNG state is needed, since every draw
        is keyed by (seed, step, sample)."""
        pipeline = getattr(self.model, "pipeline", None)
        return {
            "model": self.model,
            "optimizer": self.optimizer,
            "lr_scheduler": self.lr_scheduler,
            "ema": self.ema,
            "dataloader": self.batches,
            "pipeline": pipeline if callable(getattr(pipeline, "load_rank_states", None)) else None,
        }

    def save(self, iteration: int) -> None:
        """Save a checkpoint (atomic; in the background with ``training.async_save``) and the config."""
        assert self.saves is not None
        self.saves.save(iteration)

    def _checkpointer(self, root: str) -> DistributedCheckpointer:
        ps = self.parallel_state
        return DistributedCheckpointer(
            root, dp_rank=ps.dp_rank, dp_size=ps.dp_size, verify=self.config.training.verify_checksums
        )

    def _resume(self) -> int:
        """Restore model, optimizer, scheduler and data position in place; return the iteration. The
        optimizer's hyperparameters and the schedule's base lr stay the config's
        (:mod:`mm_trainer.run.resume_settings`).

        ``training.reset_data_position`` leaves the data out: it starts over at epoch 0."""
        root = str(self.run_dir.resume_from)
        state = self.state()
        reset = self.config.training.reset_data_position
        if reset:
            del state["dataloader"]
        refuse_dropped_tensors(self.model, root)
        keep = (
            keep_configured_phase_hyperparameters(self.phases)
            if self.phases
            else keep_configured_hyperparameters(self.optimizer, self.lr_scheduler)
        )
        with keep:  # the config's lr, decay...
            try:
                iteration = self._checkpointer(root).load(state)
            except CheckpointIntegrityError as err:
                raise CheckpointIntegrityError(
                    f"{err} (a new run starts from a checkpoint directory with training.load=<its iter_* dir>)",
                    path=err.path,
                    key=err.key,
                    iteration=err.iteration,
                ) from None
        note = " (data position reset to epoch 0: training.reset_data_position)" if reset else ""
        log_rank0(f"resumed from {root} at iteration {iteration}{note}")
        return iteration

    def train(self) -> int:
        """Run the training loop; returns the last completed iteration."""
        cfg = self.config
        log_dir = cfg.training.log_dir or cfg.training.save
        metrics = MetricsLogger(
            total_steps=cfg.training.train_iters,
            start_step=self.start_iteration,
            log_dir=log_dir,
            tensorboard=cfg.training.tensorboard,
            wandb=cfg.training.wandb,
            config=cfg.model_dump(mode="json") if cfg.training.wandb is not None else None,
            enabled=self.rank == 0,
        )
        validator = self.validator
        engine = TrainEngine(
            model=self.model,
            optimizer=self.optimizer,
            lr_scheduler=self.lr_scheduler,
            batches=self.batches,
            training=cfg.training,
            ema=self.ema,
            phases=self.phases,
            device=self.device,
            dp_group=self.parallel_state.dp_group,
            cp_rank=self.parallel_state.cp_rank,
            cp_size=self.parallel_state.cp_size,
            save_fn=self.save if self.saves else None,
            saves=self.saves,
            validate_fn=self._after_step(validator, metrics),
            metrics=metrics,
            profilers=self._profilers(log_dir),
            peak_flops=cfg.training.peak_flops,
        )
        return engine.train(self.start_iteration)

    def _after_step(self, validator: Validator | None, metrics: MetricsLogger) -> Any:
        """What runs after every step: validation (``training.validation``) and the plan check."""
        check = self.plan_check
        if validator is None and check is None:
            return None

        def after(step: int) -> dict[str, Any]:
            out = self._validate(validator, step, metrics) if validator is not None else {}
            if check is not None:
                out = {**out, **check.after_step(step, peak_memory_bytes(self.device.type))}
            return out

        return after

    def _validate(self, validator: Validator, step: int, metrics: MetricsLogger) -> dict[str, Any]:
        """One validation, with the EMA's weights swapped in when ``training.validation.ema`` says so (mm-config
        refuses it without ``training.ema``)."""
        if self.config.training.validation.ema:
            with self.ema.swapped_in():
                return validator.run(step, metrics)
        return validator.run(step, metrics)

    def _profilers(self, log_dir: str | None) -> tuple[StepProfiler, MemoryProfiler]:
        profile, memory = self.config.tools.profile, self.config.tools.memory_profile
        base = Path(log_dir or ".")
        return (
            StepProfiler(
                enable=profile.enable,
                start_step=profile.start_step,
                end_step=profile.end_step,
                output_dir=profile.output_dir or str(base / "profile"),
                rank=self.rank,
                record_shapes=profile.record_shapes,
                with_stack=profile.with_stack,
                device_type=self.device.type,
            ),
            MemoryProfiler(
                enable=memory.enable,
                start_step=memory.start_step,
                end_step=memory.end_step,
                output_dir=memory.output_dir or str(base / "memory"),
                rank=self.rank,
                device_type=self.device.type,
            ),
        )

    def close(self) -> None:
        """Release the process groups after a run that ended normally. No collective: ranks that are
        done need not wait for each other (the last step or save already synchronized them), and a
        rank that failed must not call it, but leave at once (:func:`mm_trainer.cli.run`)."""
        self.run_dir.release()  # every save has completed on all ranks by now
        if self.plan_check is not None:
            self.plan_check.close()
        if dist.is_initialized():
            dist.destroy_process_group()
