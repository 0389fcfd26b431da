"""``training``: plugins, batch arithmetic, schedule, optimizer, checkpoint and logging options."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from .base import ConfigModel, InputPath, LearningRate
from .errors import Loc, Problem, RuleViolations
from .phases import PhaseConfig
from .rewards import RewardConfig, duplicate_reward_problems
from .validation import ValidationConfig


class NonFiniteConfig(ConfigModel):
    """What to do when the loss or gradient norm is NaN/inf (``training.nonfinite``)."""

    action: Literal["skip", "stop"] = "skip"
    """``skip``: drop the step (no optimizer update); ``stop``: raise at once."""
    max_consecutive: int = Field(default=5, ge=1)
    """Stop with an error after this many consecutive skipped steps."""
    max_skipped: int | None = Field(default=None, ge=0)
    """Stop with an error naming the skipped steps' samples once more than this many steps were skipped
    since the run (re)started, consecutive or not; None: no cap."""


class EMAConfig(ConfigModel):
    """Exponential moving average of the trainable parameters (``training.ema``)."""

    decay: float = Field(default=0.999, gt=0, lt=1)
    """After every optimizer step that updates the weights: ``ema = decay * ema + (1 - decay) * w``
    (the average starts at the weights the run starts from). It remembers about ``1 / (1 - decay)``
    steps: 0.999 ~ the last 1000."""


class WandbConfig(ConfigModel):
    """Weights & Biases logging (``training.wandb``; ``pip install 'mm-trainer[wandb]'``): rank 0 logs every
    record of ``metrics.jsonl`` (its numbers, as ``train/<key>``, at the step) and the validation clips
    (videos, and audio where the model samples it) to one W&B run; its local files go to
    ``<log_dir>/wandb``. The run's id is kept there, so a run that resumes in the same log dir continues
    the same W&B run."""

    project: str = Field(min_length=1)
    """W&B project the run is logged to."""
    entity: str | None = None
    """W&B user or team that owns the project; None = the account's default entity."""
    name: str | None = None
    """Display name of the W&B run; None = one W&B generates."""
    group: str | None = None
    """W&B group of the run (runs of one experiment side by side); None = no group."""
    tags: list[str] = []
    """Tags of the W&B run."""
    notes: str | None = None
    """A description of the W&B run."""
    mode: Literal["online", "offline"] | None = None
    """``online``: stream to the W&B server; ``offline``: write the run locally only (``wandb sync
    <log_dir>/wandb/offline-run-*`` uploads it later); None = W&B's own choice (the ``WANDB_MODE``
    environment variable, else online)."""


class TrainingConfig(ConfigModel):
    """The ``training`` section."""

    plugin: list[str] = []
    """Python modules imported before the config is validated and the model is built (registrations)."""
    seed: int = Field(default=1234, ge=0, lt=2**63)
    """Base random seed (model init, data order; every training draw is keyed by (seed, step, sample, purpose))."""
    micro_batch_size: int = Field(default=1, ge=1)
    """Samples per data-parallel rank per forward/backward."""
    gradient_accumulation_steps: int | None = Field(default=None, ge=1)
    """Micro-steps accumulated per optimizer step; None = global_batch_size / (micro_batch_size x
    data-parallel size) when global_batch_size is set (so one config runs at any world size), else 1."""
    global_batch_size: int | None = Field(default=None, ge=1)
    """Samples per optimizer step = micro_batch_size x gradient_accumulation_steps x data-parallel size
    (world / (ulysses x ring)); None = computed. Set it (and leave gradient_accumulation_steps out) to
    train the same run at any layout."""
    train_iters: int = Field(default=1000, ge=1)
    """Optimizer steps to train."""
    lr: LearningRate = 1.0e-5
    """Peak learning rate (at most the largest float32: the optimizer's step is computed in float32)."""
    min_lr: float = Field(default=0.0, ge=0)
    """Learning rate at the end of a linear/cosine decay (refused with ``constant``, which never decays)."""
    lr_scheduler: Literal["constant", "linear", "cosine"] = "constant"
    """Shape of the learning rate after warmup."""
    lr_warmup_iters: int = Field(default=0, ge=0)
    """Steps of linear warmup from 0 to ``lr``."""
    optimizer: Literal["adamw"] = "adamw"
    """Optimizer."""
    adam_beta1: float = Field(default=0.9, ge=0, lt=1)
    """AdamW beta1."""
    adam_beta2: float = Field(default=0.999, ge=0, lt=1)
    """AdamW beta2."""
    adam_eps: float = Field(default=1.0e-8, gt=0)
    """AdamW epsilon."""
    weight_decay: float = Field(default=0.01, ge=0)
    """AdamW decoupled weight decay."""
    clip_grad: float | None = Field(default=1.0, ge=0)
    """Clip the global gradient norm to this value; 0 or None disables clipping."""
    load: InputPath | None = None
    """Checkpoint directory a new run starts from (model, optimizer, scheduler, data position), at any layout; a run that
    already has checkpoints in ``save`` resumes those instead (see ``resume``)."""
    reset_data_position: bool = False
    """When resuming (the run in ``save``, or ``load``), start the data over at epoch 0 instead of at the
    checkpoint's position (e.g. after changing the dataset). Without it, a checkpoint whose data state is
    missing or does not match the data is an error. A run with nothing to resume refuses it at start
    (whether there is a checkpoint to resume is known only then)."""
    save: str | None = None
    """Directory checkpoints and the resolved config are written to; None saves nothing. A run locks it
    (and ``log_dir``): a second run into it stops with an error naming the holder."""
    stage_dir: str | None = None
    """Node-local directory (a local disk on every node; ``$VARS`` are expanded, e.g.
    ``/local/$SLURM_JOB_ID``) to copy each sub-model's weights into before they are read: the
    ``from_pretrained`` / ``checkpoint_path`` folder, or a complete DCP conversion cache in its place.
    One rank per node copies, the others wait; a copy matching its source is reused. For clusters
    with a slow shared file system. None (default) reads the weights where they are; checkpoints
    (``save``) always stay on the shared storage every node sees."""
    resume: Literal["auto", "must", "never"] = "auto"
    """``auto``: a ``save`` dir that holds a checkpoint is resumed (else start from ``load``, or the
    pretrained weights); ``must``: the same, but an error when there is nothing to resume;
    ``never``: start over, moving a non-empty ``save`` dir aside to ``<save>.previous-<time>``
    (nothing is deleted)."""
    save_interval: int = Field(default=1000, ge=1)
    """Save a checkpoint every this many steps (and at the end)."""
    keep_last: int | None = Field(default=None, ge=1)
    """Keep only this many newest checkpoints (full and model-only counted apart); None keeps all. Only
    this run's own ``iter_*`` dirs (up to the iteration saved) are deleted, after the new one is complete."""
    keep_every: int | None = Field(default=None, ge=1)
    """Also keep, whatever ``keep_last`` says, every checkpoint whose iteration is a multiple of this
    (e.g. 1000: one per thousand steps for evaluation); None: ``keep_last`` alone decides."""
    verify_checksums: bool = True
    """Check every file a resume (or ``load``) reads against the CRC-32 its save recorded (each DCP
    storage item, each per-rank state record), so a corrupted checkpoint stops the run naming the file,
    the tensor and the checkpoint to resume instead. False skips the check: a faster load (it reads
    the checkpoint's bytes once more, from the page cache), and corrupted weights load unnoticed."""
    model_save_interval: int | None = Field(default=None, ge=1)
    """Also save the weights alone (the trainable sub-models, their LoRA adapters and the EMA; no optimizer,
    no data position) every this many steps, into ``<save>/model_only/iter_*``: what ``export`` and
    ``sample`` read, a fraction of a full checkpoint's size. None: none. A resume never starts from them."""
    async_save: bool = False
    """Write checkpoints in the background: each save stages the state in (pinned, on an accelerator)
    host memory, then training continues while the files are written (at most one save in flight; the
    tracker moves once they are complete). Costs one copy of the checkpointed state in host memory per
    rank (``mm-train plan`` shows it). A failed write stops the run at the next step with its error;
    a stop signal and the end of training wait for the save in flight."""
    lock_lease_s: float = Field(default=120.0, gt=0)
    """The run's lock on ``save`` / ``log_dir`` is a lease renewed every quarter of this; a lock not
    renewed for this long is stale and taken over (so a requeued job on another node resumes). Hosts
    sharing the save dir need clocks agreeing to well within it."""
    log_interval: int = Field(default=1, ge=1)
    """Log metrics every this many steps."""
    log_sample_ids: bool = False
    """Add ``sample_ids`` to each metrics record: the global sample indices the step trained, over all
    data-parallel ranks in global batch order (an audit that a resumed or re-laid-out run trains every
    sample once; one all-gather per step)."""
    log_dir: str | None = None
    """Directory for metrics JSONL and TensorBoard events; None = ``save`` (or no files)."""
    tensorboard: bool | None = None
    """Also write TensorBoard events (``<log_dir>/tensorboard``). None (default): when the
    ``tensorboard`` package is installed; true: required (an error without it); false: never."""
    wandb: WandbConfig | None = None
    """Also log to Weights & Biases (needs ``mm-trainer[wandb]``, and ``log_dir`` or ``save``); None
    (default): not."""
    validation: ValidationConfig | None = None
    """Sampled clips and a held-out loss every ``validation.interval`` steps (written under
    ``log_dir`` or ``save``); None = no validation during training."""
    peak_flops: float | None = Field(default=None, gt=0)
    """Peak FLOP/s of one device for the MFU metric; None = looked up by device name (H200, H100,
    A100, Ascend 910B), no MFU where unknown (CPU)."""
    trainable_submodels: list[str] | None = None
    """Sub-models that are trained (names from ``model.models``, ``model`` in the single form);
    None = every sub-model that is not frozen."""
    ema: EMAConfig | None = None
    """Keep an exponential moving average of the trainable parameters (on each rank's shards, saved and
    resumed with the checkpoint, exportable with ``export --ema``); None (default): none."""
    phases: dict[str, PhaseConfig] = {}
    """Named training phases (distillation: ``critic`` and ``generator``), each with its sub-models,
    optimizer, LR schedule and cadence, in update order (docs/DESIGN.md "Training phases"); empty
    (default): one optimizer over every trainable parameter, ``model(**batch)`` without a phase."""
    rewards: list[RewardConfig] = []
    """Rewards, each a registered scorer with a weight and options (docs/DESIGN.md "Rewards"): every clip
    ``validation`` samples is scored by each (``val_reward_<id>``, the mean over the prompts) and by their
    weighted sum (``val_reward``); a reward fine-tuning run (``model.pipeline.grpo`` or ``nft``) trains on the
    weighted sum of its rollouts' scores. Needs ``validation.prompts``, ``model.pipeline.grpo`` or ``nft``. Empty (default):
    none."""
    reward_failure: Literal["stop", "skip"] = "stop"
    """What a reward that raises or scores NaN / inf on a sample does: ``stop`` (default) ends the run
    with a ``RewardError`` naming the reward and the sample (exit code 65, no traceback); ``skip`` drops
    that sample from the batch's reward statistics (every reward's and the weighted sum's), counts it
    (``val_reward_skipped``) and logs a line naming the reward, the sample and the error."""
    nonfinite: NonFiniteConfig = NonFiniteConfig()
    """Handling of NaN/inf loss or gradient norm."""
    deterministic: bool = False
    """Use deterministic algorithms (slower; bitwise reproducible runs)."""
    device: str | None = Field(default=None, pattern=r"^(cpu|cuda|npu)$")
    """``cpu``, ``cuda`` or ``npu`` for the process group, the device mesh and the model (rank r of a
    node uses device ``LOCAL_RANK``, so no index is given); None picks npu, then cuda, then cpu."""
    collective_timeout_s: float | None = Field(default=600.0, gt=0)
    """Seconds a collective (on every process group of the run, gloo / NCCL / HCCL) may wait for the
    other ranks before this rank fails: how long a job can hang when a rank dies or stops answering.
    Keep it above ``HCCL_EXEC_TIMEOUT`` (``launch/ascend.sh``: 540). The long waits of one rank for
    another (weight staging, hashing and conversion, asynchronous saves) have their own
    ``long_wait_timeout_s``; None = the backend's default (30 min gloo, 10 min NCCL)."""
    long_wait_timeout_s: float = Field(default=3600.0, gt=0)
    """Seconds the ranks may wait for work that some rank does alone, on a process group of its own
    (gloo): the node-local copy of ``stage_dir``, the hash check and the online DCP conversion of
    weights, and the background writes of ``async_save``. Bounds how long those can hang."""

    @model_validator(mode="after")
    def _schedule_consistent(self) -> TrainingConfig:
        problems = []
        if self.min_lr > self.lr:
            problems.append(
                Problem(("min_lr",), f"must not exceed training.lr ({self.lr})", self.min_lr, deps=(("lr",),))
            )
        else:  # one problem per key
            problems += _min_lr_problems(self)
        if self.lr_warmup_iters > self.train_iters:
            problems.append(
                Problem(
                    ("lr_warmup_iters",),
                    f"must not exceed training.train_iters ({self.train_iters})",
                    self.lr_warmup_iters,
                    deps=(("train_iters",),),
                )
            )
        if self.validation is not None and self.save is None and self.log_dir is None:
            problems.append(
                Problem(
                    ("validation",),
                    "writes its clips and val_loss under training.log_dir (or save): set one of them",
                    deps=(("log_dir",), ("save",)),
                )
            )
        if self.validation is not None and self.validation.ema and self.ema is None:
            problems.append(
                Problem(
                    ("validation", "ema"),
                    "validates with the EMA of the weights, and training.ema keeps none: set training.ema",
                    True,
                    deps=(("ema",),),
                )
            )
        problems += [p.prefixed(("rewards",)) for p in duplicate_reward_problems(self.rewards)]
        if self.reward_failure != "stop" and not self.rewards:
            problems.append(
                Problem(
                    ("reward_failure",),
                    "says what a failing reward does, and training.rewards lists none: remove it",
                    self.reward_failure,
                    deps=(("rewards",),),
                )
            )
        if self.wandb is not None and self.save is None and self.log_dir is None:
            problems.append(
                Problem(
                    ("wandb",),
                    "keeps its local files and run id under training.log_dir (or save): set one of them",
                    deps=(("log_dir",), ("save",)),
                )
            )
        if problems:
            raise RuleViolations(problems)
        return self


def _min_lr_problems(t: TrainingConfig) -> list[Problem]:
    """A ``min_lr`` is the end of a decay: refused where every schedule that reads it is ``constant``
    (``training.min_lr`` is read by the run's schedule, or with phases by each phase without its own),
    and a phase's above its own peak."""
    out: list[Problem] = []
    readers = [n for n, ph in t.phases.items() if ph.min_lr is None] if t.phases else [None]
    kinds = {(t.phases[n].lr_scheduler if n else None) or t.lr_scheduler for n in readers}
    if t.min_lr > 0 and readers and kinds == {"constant"}:
        which = (
            "training.lr_scheduler" if not t.phases else f"the schedule of the phases {readers} that read it"
        )
        out.append(
            Problem(
                ("min_lr",),
                f"ends a linear / cosine decay, and {which} is `constant`: nothing reads it (set "
                "lr_scheduler: linear or cosine, or leave min_lr out)",
                t.min_lr,
                deps=(("lr_scheduler",), ("phases",)),
            )
        )
    for name, phase in t.phases.items():
        if phase.min_lr is None:
            continue
        loc: Loc = ("phases", name, "min_lr")
        kind, peak = phase.lr_scheduler or t.lr_scheduler, t.lr if phase.lr is None else phase.lr
        if kind == "constant" and phase.min_lr > 0:
            out.append(
                Problem(
                    loc,
                    "ends a linear / cosine decay, and this phase's schedule is `constant`: nothing reads it",
                    phase.min_lr,
                    deps=(("lr_scheduler",), ("phases", name, "lr_scheduler")),
                )
            )
        elif phase.min_lr > peak:
            out.append(
                Problem(loc, f"must not exceed the phase's lr ({peak})", phase.min_lr, deps=(("lr",),))
            )
    return out


__all__ = ["EMAConfig", "NonFiniteConfig", "TrainingConfig", "WandbConfig"]
