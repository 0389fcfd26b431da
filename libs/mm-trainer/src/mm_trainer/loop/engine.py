"""TrainEngine: the training loop. It assumes three things of a model (docs/DESIGN.md
"The model contract"):
``model(**batch)`` returns an object with ``.loss``; gradient sync is FSDP's;
checkpoints go through ``state_dict()`` / ``load_state_dict()``.

Randomness: the ``sample_ids`` of a batch (global sample indices, from the batch stream) are taken
out of it and passed as ``model(**batch, rng=SampleRNG(seed, step, sample_ids))``, so that every
draw the pipeline makes is keyed by (seed, step, sample, purpose); the global python / numpy /
torch RNGs are reseeded from (seed, step, first sample) before each micro-batch, so that code that
still draws from them (dropout) repeats on resume and at any layout with the same micro batch size.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist
from mm_data import BadSampleError
from mm_parallel import clip_grad_norm_, set_gradient_sync
from mm_pipelines import SampleRNG
from torch import nn

from mm_trainer.data.batches import to_device
from mm_trainer.loop.metrics import MetricsLogger, device_peak_flops, peak_memory_bytes
from mm_trainer.loop.nonfinite import RESUME_ADVICE, NonFiniteGuard, NonFiniteLossError, state_is_finite
from mm_trainer.loop.seeding import seed_everything
from mm_trainer.model.ema import ParameterEMA
from mm_trainer.run.stop_signals import StopSignals


class Phase(Protocol):
    """What the engine runs of a training phase (``training.phases``; built by
    :func:`mm_trainer.modes.phases.build_phases`, a room above the loop): its name, cadence, parameters,
    optimizer and LR schedule."""

    name: str
    optimizer: torch.optim.Optimizer
    lr_scheduler: Any
    every: int

    @property
    def params(self) -> list[nn.Parameter]: ...

    def due(self, step: int) -> bool: ...


@dataclass
class StepResult:
    """What one optimizer step produced (values are already averaged over data-parallel ranks)."""

    loss: float
    grad_norm: float
    skipped: bool
    samples: int
    tokens: int
    flops: float
    bad_samples: int = 0
    stop_requests: int = 0
    """Ranks (of all ranks) that received SIGTERM / SIGINT by this step: every rank stops if any did."""
    sample_ids: list[int] | None = None  # the step's global sample indices (training.log_sample_ids)
    phase_losses: dict[str, float] | None = None  # training.phases: each updated phase's loss
    logged: dict[str, float] | None = None
    """The pipeline's ``PipelineOutput.logged`` means (``dpo_margin``) and, outside phases, its
    ``loss_<part>`` metrics (LTX-2's ``loss_video`` / ``loss_audio``), averaged over the step's micro-batches
    and data-parallel ranks."""
    lrs: dict[str, float] | None = None
    """The learning rate the step's optimizer update used (read before its schedule stepped): ``{"": lr}``
    without phases, ``{phase: lr}`` of each phase that updated."""


class TrainEngine:
    """Runs optimizer steps with gradient accumulation, clipping, logging, checkpoints and stop saves.

    ``validate_fn(step)`` runs after every step on every rank (``training.validation``: it decides
    whether the step is due); what it returns (``val_loss``) joins that step's metrics record.

    ``dp_group`` is the data-parallel group (loss averaged, counters summed over it). With context
    parallelism each CP rank has its own data-parallel group; ``cp_rank`` / ``cp_size`` place this
    rank's values so that the step's single all-reduce, over all ranks, still sums each data-parallel
    group apart while a stop request (SIGTERM / SIGINT, :mod:`mm_trainer.run.stop_signals`) reaches every
    rank, including the other CP ranks of the same data-parallel rank. ``ema`` (a
    :class:`mm_trainer.ParameterEMA`) is updated after every optimizer step that changed the weights.

    ``saves`` (a :class:`mm_trainer.run.checkpoint_saves.CheckpointSaves`): after every step a background
    save whose write ended is committed, or its failure raised; model-only saves every
    ``training.model_save_interval``; a stop and the end of training wait for the save in flight.
    """

    def __init__(
        self,
        *,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        lr_scheduler: Any,
        batches: Any,
        training: Any,
        device: torch.device,
        dp_group: Any = None,
        cp_rank: int = 0,
        cp_size: int = 1,
        save_fn: Callable[[int], None] | None = None,
        validate_fn: Callable[[int], dict[str, float]] | None = None,
        metrics: MetricsLogger | None = None,
        profilers: tuple[Any, ...] = (),
        peak_flops: float | None = None,
        ema: ParameterEMA | None = None,
        phases: list[Phase] | None = None,
        saves: Any = None,
    ) -> None:
        self.model, self.optimizer, self.lr_scheduler = model, optimizer, lr_scheduler
        self.batches, self.training, self.device = batches, training, device
        self.dp_group, self.save_fn, self.ema, self.validate_fn = dp_group, save_fn, ema, validate_fn
        self.saves = saves  # CheckpointSaves: model-only saves, background saves' completion
        self.cp_rank, self.cp_size = cp_rank, cp_size
        self.phases = phases or []
        # the record's `lr`: the step's own, or with phases the first phase that updates at every step
        # (the config requires one), so the line is one phase's at every step; each has its lr_<phase>
        self._lr_phase = next((p.name for p in self.phases if p.every == 1), "") if self.phases else ""
        _check_layout(dp_group, cp_rank, cp_size)
        self.metrics = metrics or MetricsLogger(total_steps=training.train_iters, enabled=False)
        self.profilers = profilers
        self.peak_flops = device_peak_flops(device.type, override=peak_flops)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.nonfinite = NonFiniteGuard(training.nonfinite, self.metrics.write)
        self.stop_signals = StopSignals()

    # ---------------------------------------------------------------- loop
    def train(self, start_iteration: int = 0) -> int:
        """Train from ``start_iteration`` to ``training.train_iters``; return the last completed iteration."""
        training = self.training
        self.model.train()
        self.stop_signals.install()
        iteration = start_iteration
        pending_save = False
        failed = True  # until the loop ends without an exception: the trackers record how the run ended
        try:
            while iteration < training.train_iters:
                for prof in self.profilers:
                    prof.step_begin(iteration)
                started = time.perf_counter()
                result = self.train_step(iteration)
                elapsed = time.perf_counter() - started
                for prof in self.profilers:
                    prof.step_end(iteration)
                iteration += 1
                self.metrics.advance()
                validation = self.validate_fn(iteration) if self.validate_fn else {}
                if validation or iteration % training.log_interval == 0 or iteration == training.train_iters:
                    self.metrics.log(iteration, {**self._metrics(result, elapsed), **validation})
                due = iteration == training.train_iters or (
                    training.save_interval and iteration % training.save_interval == 0
                )
                saved = False
                if self.saves is not None:
                    self.saves.check()  # a failed background save ends the run here, with its error
                model_every = (
                    getattr(training, "model_save_interval", None) if self.saves is not None else None
                )
                # before a full save of the same iteration: with async_save the full one then waits
                # for the model-only write (weights only), not the other way round
                if model_every and iteration % model_every == 0:
                    self._save_if_finite(iteration, result.loss, self.saves.save_model)
                if self.save_fn and (due or result.stop_requests or pending_save):
                    saved = self._save_if_finite(iteration, result.loss, self.save_fn)
                    pending_save = not saved  # a due save that was refused is made at the next finite step
                if result.stop_requests:
                    self.metrics.write(self._stop_message(result.stop_requests, iteration, saved))
                    break
            if self.saves is not None:
                self.saves.finish()  # the save in flight completes before the run ends (or stops)
            if pending_save and iteration == training.train_iters:
                raise NonFiniteLossError(
                    f"the run reached training.train_iters={iteration} with a non-finite last step: its state was "
                    f"not saved. Skipped steps: {self.nonfinite.describe() or 'none'}. {RESUME_ADVICE}"
                )
            failed = False
        finally:
            self.stop_signals.release()
            self.metrics.close(failed=failed)
        return iteration

    def train_step(self, step: int) -> StepResult:
        """Optimizer step ``step`` (0-based over the run) over ``gradient_accumulation_steps`` micro-batches."""
        if self.phases:
            return self._phased_step(step)
        accum = self.training.gradient_accumulation_steps
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        samples = tokens = 0
        flops = 0.0
        step_ids: list[int] = []
        logged = LoggedMeans(part_losses=True)
        for micro in range(accum):
            batch = to_device(self.batches.next_batch(), self.device)
            extra = self._keyed_rng(batch, step)
            step_ids += extra["rng"].sample_ids if extra else []
            set_gradient_sync(self.model, micro == accum - 1)
            output = self.model(**batch, **extra)
            (output.loss / accum).backward()
            loss_sum += output.loss.detach().double()
            info = getattr(output, "metrics", None) or {}
            samples += int(info.get("num_samples", _batch_size(batch)))
            tokens += int(info.get("num_tokens", 0))
            flops += float(info.get("flops", 0.0))
            logged.add(output)
        grad_norm = clip_grad_norm_(self.params, self.training.clip_grad or 0.0)
        bad = int(getattr(self.batches, "bad_this_epoch", 0))
        loss, counts, stop_requests = self._dp_reduce(loss_sum / accum, [samples, tokens, flops, bad])
        self._check_bad_samples(int(counts[3]))
        finite = math.isfinite(loss) and bool(torch.isfinite(torch.as_tensor(grad_norm)).all())
        skipped = not finite
        if finite:
            self.optimizer.step()
            if self.ema is not None:  # a skipped step changed no weight: the average stays too
                self.ema.update()
            self.nonfinite.finite_step()
        else:  # every rank agrees (reduced loss, global norm): the gather below is collective
            samples = self._describe_samples(self._gather_sample_ids(step_ids))
            self._withdraw_inputs(step)
            self.nonfinite.skip(step + 1, loss, float(grad_norm), samples)
        self.optimizer.zero_grad(set_to_none=True)
        lr = _current_lr(self.optimizer)  # the step's: the schedule moves on to the next step's below
        self.lr_scheduler.step()
        result = StepResult(
            loss, float(grad_norm), skipped, int(counts[0]), int(counts[1]), counts[2], int(counts[3]),
            stop_requests, lrs={"": lr}, logged=logged.means(self.dp_group, self.device),
        )  # fmt: skip
        if self.training.log_sample_ids:
            result.sample_ids = self._gather_sample_ids(step_ids)
        return result

    def _phased_step(self, step: int) -> StepResult:
        """Step ``step`` with ``training.phases``: the step's micro-batches are read once, then every phase
        due at ``step`` (in order) runs ``model(**batch, rng=..., phase=name)`` over them, clips and steps
        its own optimizer and schedule. The reported loss is the mean of the updated phases' losses."""
        accum = self.training.gradient_accumulation_steps
        micro_batches = [to_device(self.batches.next_batch(), self.device) for _ in range(accum)]
        ids = [batch.pop("sample_ids", None) for batch in micro_batches]
        phase_losses: dict[str, float] = {}
        lrs: dict[str, float] = {}
        norms, skipped, samples = [], False, 0
        logged: dict[str, float] = {}
        for phase in (p for p in self.phases if p.due(step)):
            loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
            means = LoggedMeans()
            for micro, (batch, sample_ids) in enumerate(zip(micro_batches, ids)):
                extra = self._keyed_rng({"sample_ids": sample_ids}, step) if sample_ids is not None else {}
                set_gradient_sync(self.model, micro == accum - 1)
                output = self.model(**batch, **extra, phase=phase.name)
                (output.loss / accum).backward()
                loss_sum += output.loss.detach().double()
                means.add(output)
            samples = sum(_batch_size(batch) for batch in micro_batches)
            loss = loss_sum / accum
            if dist.is_initialized():
                dist.all_reduce(loss, group=self.dp_group)
                loss /= dist.get_world_size(self.dp_group)
            grad_norm = float(clip_grad_norm_(phase.params, self.training.clip_grad or 0.0))
            finite = math.isfinite(float(loss)) and math.isfinite(grad_norm)
            if finite:
                phase.optimizer.step()
            skipped |= not finite
            self.model.zero_grad(set_to_none=True)  # the other phases' gradients too: each phase starts clean
            lrs[phase.name] = _current_lr(phase.optimizer)  # this update's, before its schedule moves on
            phase.lr_scheduler.step()
            phase_losses[phase.name], norms = float(loss), [*norms, grad_norm]
            logged |= means.means(self.dp_group, self.device)
        mean = sum(phase_losses.values()) / len(phase_losses)
        bad = int(getattr(self.batches, "bad_this_epoch", 0))
        _, counts, stop_requests = self._dp_reduce(torch.zeros(()), [samples, 0, 0.0, bad])
        self._check_bad_samples(int(counts[3]))
        step_ids = [i for part in ids if part is not None for i in part]
        if skipped:  # every rank agrees (reduced losses, global norms): the gather is collective
            self._withdraw_inputs(step)
            self.nonfinite.skip(
                step + 1, mean, max(norms), self._describe_samples(self._gather_sample_ids(step_ids))
            )
        else:
            if self.ema is not None:
                self.ema.update()
            self.nonfinite.finite_step()
        result = StepResult(mean, max(norms), skipped, int(counts[0]), 0, 0.0, int(counts[3]), stop_requests)
        result.phase_losses, result.lrs, result.logged = phase_losses, lrs, logged
        if self.training.log_sample_ids:
            result.sample_ids = self._gather_sample_ids(step_ids)
        return result

    def _withdraw_inputs(self, step: int) -> None:
        """At the first non-finite step of a streak (``step``, 0-based), withdraw the checkpoints whose
        state was its input or later (iteration ``step`` and on): their weights may have blown up in a
        step whose loss was still finite (:mod:`mm_trainer.loop.nonfinite`). Every rank (collective)."""
        if self.nonfinite.in_a_row or self.saves is None:
            return
        outcome = self.saves.withdraw(step)
        self.nonfinite.streak_begins(
            step + 1, outcome.describe(self.saves.root) if outcome.withdrawn else None
        )

    def _keyed_rng(self, batch: dict, step: int) -> dict[str, SampleRNG]:
        """``{"rng": SampleRNG}`` from the batch's ``sample_ids`` (popped), after reseeding the global
        RNGs from the same key; ``{}`` for a batch without them."""
        ids = batch.pop("sample_ids", None)
        if ids is None:
            return {}
        rng = SampleRNG(seed=self.training.seed, step=step, sample_ids=ids, device=self.device)
        seed_everything(rng.micro_batch_seed())
        return {"rng": rng}

    def _gather_sample_ids(self, ids: list[int]) -> list[int]:
        """The step's global sample indices over all data-parallel ranks, in global batch order."""
        local = torch.tensor(ids, dtype=torch.long, device=self.device)
        if not dist.is_initialized():
            return local.tolist()
        parts = [torch.empty_like(local) for _ in range(dist.get_world_size(self.dp_group))]
        dist.all_gather(parts, local, group=self.dp_group)
        return torch.cat(parts).tolist()

    # ------------------------------------------------------------- helpers
    def _describe_samples(self, sample_ids: list[int]) -> str:
        """The samples of a step in words: their global indices, and where the batch stream can tell,
        which rows of the data they are (``describe_samples``)."""
        describe = getattr(self.batches, "describe_samples", None)
        return describe(sample_ids) if callable(describe) else f"global sample ids {sample_ids}"

    def _save_if_finite(self, iteration: int, loss: float, save: Callable[[int], None]) -> bool:
        """``save(iteration)`` unless its loss or parameters are non-finite (then say so); every rank."""
        problem = state_is_finite(loss, self.params, self.device)
        if problem is None:
            save(iteration)
            return True
        self.metrics.write(
            f"not saving iteration {iteration}: {problem}; the latest checkpoint stays the last finite one "
            "(saved at the next finite step)"
        )
        return False

    def _check_bad_samples(self, total: int) -> None:
        """Stop when this epoch's bad samples, summed over data-parallel ranks, pass the dataset's limit."""
        limit = getattr(self.batches, "bad_limit", None)
        if limit is not None and total > limit:
            raise BadSampleError(
                f"{total} bad samples so far this epoch across all data-parallel ranks and loader workers: "
                f"more than data.dataset.max_bad_fraction allows ({int(limit)}). Each was logged as "
                "'skipping bad sample'; `mm-data check` on the metadata file lists them all"
            )

    def _dp_reduce(self, loss: torch.Tensor, counts: list[float]) -> tuple[float, list[float], int]:
        """Loss averaged and counters summed over the data-parallel group, and the ranks asking to
        stop counted over all ranks, in one all-reduce.

        The all-reduce spans every rank, so that a stop reaches the CP ranks of this data-parallel
        rank too (they sit in other data-parallel groups). Its tensor is ``cp_size`` rows of
        ``[loss, *counts]`` and one stop slot: a rank fills the row of its CP rank and leaves the
        others zero. The ranks of one data-parallel group are the ranks of one CP rank, so after the
        sum that row holds its group's sums, as an all-reduce over the group alone would.

        fp32 on the training device: NCCL / HCCL reduce device tensors only.
        """
        width = 1 + len(counts)
        t = torch.zeros(self.cp_size * width + 1, dtype=torch.float32, device=self.device)
        start = self.cp_rank * width
        t[start] = loss.detach().float()
        t[start + 1 : start + width] = torch.tensor(counts, dtype=torch.float32)
        t[-1] = float(self.stop_signals.received is not None)
        if dist.is_initialized():
            dist.all_reduce(t)
            t[start] /= dist.get_world_size(self.dp_group)
        values = t.tolist()
        return values[start], values[start + 1 : start + width], int(values[-1])

    def _stop_message(self, requests: int, iteration: int, saved_it: bool) -> str:
        world = dist.get_world_size() if dist.is_initialized() else 1
        saved = (
            f"saved iteration {iteration}"
            if saved_it
            else ("nothing saved (non-finite state)" if self.save_fn else "nothing saved (no training.save)")
        )
        return f"stop requested (SIGTERM / SIGINT) on {requests} of {world} rank(s): {saved}, exiting"

    def _metrics(self, r: StepResult, elapsed: float) -> dict[str, Any]:
        out: dict[str, Any] = {
            "loss": r.loss,
            "grad_norm": r.grad_norm,
            "lr": (r.lrs or {}).get(self._lr_phase, float("nan")),
            "step_time_s": elapsed,
            "samples_per_s": r.samples / elapsed if elapsed > 0 else 0.0,
            "tokens_per_s": r.tokens / elapsed if elapsed > 0 else 0.0,
            "peak_memory_bytes": peak_memory_bytes(self.device.type),
            "skipped": r.skipped,
            "skipped_total": len(self.nonfinite.skipped),
        }
        if getattr(self.batches, "bad_limit", None) is not None:
            out["bad_samples_epoch"] = r.bad_samples
        if r.sample_ids is not None:
            out["sample_ids"] = r.sample_ids
        for name, lr in (r.lrs or {}).items():
            if name:  # a phase that updated at this step, as its loss_<phase>
                out[f"lr_{name}"] = lr
        for name, value in (r.phase_losses or {}).items():
            out[f"loss_{name}"] = value
        out |= r.logged or {}
        if r.flops and self.peak_flops:
            world = dist.get_world_size() if dist.is_initialized() else 1
            out["mfu"] = r.flops / elapsed / (self.peak_flops * world)
        return out


class LoggedMeans:
    """A step's ``PipelineOutput.logged`` values (with ``part_losses``, also its ``metrics``' ``loss_<part>``
    values, e.g. LTX-2's ``loss_video`` / ``loss_audio``): summed over its micro-batches, then averaged over
    them and the data-parallel ranks (one all-reduce; every rank's pipeline logs the same names)."""

    def __init__(self, *, part_losses: bool = False) -> None:
        self.sums: dict[str, float] = {}
        self.count = 0
        self.part_losses = part_losses

    def add(self, output: Any) -> None:
        values = dict(getattr(output, "logged", None) or {})
        if self.part_losses:
            metrics = getattr(output, "metrics", None) or {}
            values |= {name: value for name, value in metrics.items() if name.startswith("loss_")}
        for name, value in values.items():
            self.sums[name] = self.sums.get(name, 0.0) + float(value)
        self.count += 1 if values else 0

    def means(self, dp_group: Any, device: torch.device) -> dict[str, float]:
        if not self.sums:
            return {}
        names = sorted(self.sums)
        t = torch.tensor([self.sums[n] / self.count for n in names], dtype=torch.float64, device=device)
        if dist.is_initialized():
            dist.all_reduce(t, group=dp_group)
            t /= dist.get_world_size(dp_group)
        return dict(zip(names, t.tolist(), strict=True))


def _current_lr(optimizer: torch.optim.Optimizer) -> float:
    """The learning rate ``optimizer`` updates with now (its first group's: the schedule sets them alike)."""
    return float(optimizer.param_groups[0]["lr"])


def _check_layout(dp_group: Any, cp_rank: int, cp_size: int) -> None:
    """The step's all-reduce places values by CP rank: the data-parallel groups must tile the world."""
    if not 0 <= cp_rank < cp_size:
        raise ValueError(f"cp_rank {cp_rank} is not in [0, cp_size={cp_size})")
    if dist.is_initialized():
        dp_size, world = dist.get_world_size(dp_group), dist.get_world_size()
        if dp_size * cp_size != world:
            raise ValueError(
                f"data-parallel group size {dp_size} x cp_size {cp_size} != world size {world}: every rank "
                "must belong to one data-parallel group per CP rank"
            )


def _batch_size(batch: dict) -> int:
    if isinstance(batch.get("conditions"), dict):  # encoded ahead (features.condition_micro_steps)
        batch = batch["conditions"]
    for value in batch.values():
        if isinstance(value, torch.Tensor) and value.ndim > 0:
            return int(value.shape[0])
        if isinstance(value, list):
            return len(value)
    return 0
