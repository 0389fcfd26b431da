"""Validation during training (``training.validation``): sampled clips and a held-out loss.

The trainer knows no model: it calls two hooks of the model container.

- ``sample(prompt, *, seed, num_frames, height, width, steps, guidance_scale, negative_prompt,
  shift, fps) -> video [3, F, H, W] in [-1, 1]``, or a :class:`mm_trainer.SampledClip` with the clip's
  audio (written beside the clip as ``<index>.wav``), for the clips; with ``audio_guidance_scale`` set
  (a model that samples sound) it is passed too, and a ``sample`` without that keyword is refused. Optional: ``check_sampling()``
  raises before training when sampling could not run; ``prepare_sampling(validation, *, data, device)``
  is called once, before training, with the ``training.validation`` section (the prompts, the clip size)
  and the ``data`` section (a model that trains on cached latents loads its frozen encoders from where
  the cache was written, e.g. ``data.dataset.preprocess``, and may encode the prompts once);
- optionally ``sample_reference(prompt, *, seed, num_frames, height, width) -> video`` where
  ``has_sample_reference`` is true: the clip each sampled one is compared against (a distillation's
  teacher, many steps); its PSNR to the sampled clip, averaged over prompts, is ``val_psnr_to_reference``
  (references are drawn once per run: the teacher is frozen);
- ``validation_loss(batch, rng, num_timesteps) -> [B]`` (:meth:`mm_trainer.ModelContainer.validation_loss`,
  which asks the pipeline), for ``val_loss``; or a mapping of such ``[B]`` losses with ``loss`` among them
  (each logged as ``val_<name>``: LTX-2's ``val_loss_video`` and ``val_loss_audio`` beside ``val_loss``).

With ``training.rewards``, every sampled clip is scored by each reward (``rewards``, a
:class:`mm_trainer.modes.rewards.Rewards` built by the trainer): ``val_reward_<id>`` is each reward's mean
over the prompts (with ``_std``, ``_min`` and ``_max`` over them), ``val_reward`` the mean of their
weighted sum; each clip's scores are written beside the clips, ``iter_<step>/rewards.json``; a reward that
fails or scores NaN names the reward and the prompt (index, text and seed). Rewards on decoded frames only: validation's clips are
decoded (a reward on latents is refused here, before training). The clips of one prompt text (prompts
repeated with other seeds) form a group, scored together once its last clip is sampled: a groupwise
reward compares them. With ``training.reward_failure: skip`` a clip a reward fails on is left out of the
statistics (``"skipped": true`` in ``rewards.json``) and counted, ``val_reward_skipped``.

Every rank takes part in both: sharded (FSDP) sub-models gather their weights in each forward, so
every rank runs the same forwards. Each rank samples every prompt (rank 0 writes the clips); the
held-out samples are dealt round-robin over the data-parallel ranks (sample ``i`` to dp rank
``i mod dp_size``, one sample per forward, the last round padded with repeats whose loss is
dropped), then gathered and averaged in sample order. Noise is keyed by prompt seed or held-out
sample index (``SampleRNG``), never by rank or step, so a config writes the same clips and loss at
any layout, and ``val_loss`` at two steps differs only by what the model learnt.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from mm_data import collate_video_text, write_video, write_wav
from mm_pipelines import SampleRNG, key_seed
from torch import nn

from mm_trainer.data.batches import build_dataset
from mm_trainer.loop.metrics import MetricsLogger
from mm_trainer.model.sampled_clip import as_sampled_clip


class Validator:
    """Runs ``training.validation`` after every ``interval`` optimizer steps.

    Args:
        model: the model container (``sample`` / ``validation_loss`` hooks, see the module docstring).
        validation: the ``training.validation`` section (``mm_config.ValidationConfig``).
        data: the ``data`` section: the held-out file is read by its dataset, with its options.
        seed: ``training.seed`` (keys the held-out noise).
        out_dir: the run's log folder; clips go to ``out_dir/validation/iter_<step>/<prompt index>.mp4``
            (their audio, where the model samples it, beside them as ``<prompt index>.wav``).
        device: the training device.
        dp_rank, dp_size, dp_group: this rank's data-parallel place (ranks of one CP group get the
            same held-out samples).
        write: whether this rank writes the clips (rank 0).
        rewards: ``training.rewards`` built (:class:`mm_trainer.modes.rewards.Rewards`), scoring the clips;
            None or empty: none.

    Raises:
        ValueError: the model has no hook for what the section asks (checked here, before training).
    """

    def __init__(
        self,
        model: nn.Module,
        validation: Any,
        *,
        data: Any,
        seed: int,
        out_dir: str | Path,
        device: torch.device,
        dp_rank: int = 0,
        dp_size: int = 1,
        dp_group: Any = None,
        write: bool = True,
        rewards: Any = None,
    ) -> None:
        self.model, self.config, self.device = model, validation, device
        self.rewards = rewards if rewards else None
        if self.rewards is not None and self.rewards.needs - {"frames"}:
            raise ValueError(
                f"training.rewards: validation scores its decoded clips, and the rewards {self.rewards.ids} "
                f"need {sorted(self.rewards.needs - {'frames'})}: only rewards on frames score validation clips"
            )
        self.out_dir, self.write = Path(out_dir) / "validation", write
        self.dp_rank, self.dp_size, self.dp_group = dp_rank, dp_size, dp_group
        self.noise_seed = key_seed(seed, "validation")
        _check_hooks(model, validation)
        prepare = getattr(model, "prepare_sampling", None)
        if validation.prompts and callable(prepare):
            prepare(validation, data=data, device=device)
        self.dataset = None
        self.references: dict[int, torch.Tensor] = {}
        if validation.data_path is not None:
            self.dataset = build_dataset(data, data_path=validation.data_path)
            self.collate = getattr(self.dataset, "collate_fn", None) or collate_video_text

    def due(self, step: int) -> bool:
        """Whether optimizer step ``step`` (1-based) ends with a validation."""
        return step % self.config.interval == 0

    def run(self, step: int, metrics: MetricsLogger | None = None) -> dict[str, float]:
        """Validate after step ``step`` if it is due: write the clips (and log them to the trackers
        through ``metrics``); return ``val_loss`` (with held-out data; and ``val_<name>`` of each further
        loss the model gives) and ``val_time_s`` (``{}`` when not due)."""
        if not self.due(step):
            return {}
        started = time.perf_counter()
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                out = self._clips(step, metrics)
                if self.dataset is not None:
                    out.update(self._loss())
        finally:
            self.model.train(was_training)
        return {**out, "val_time_s": time.perf_counter() - started}

    def _clips(self, step: int, metrics: MetricsLogger | None) -> dict[str, float]:
        """Sample and write every prompt's clip; ``val_psnr_to_reference`` where the model draws references."""
        cfg, psnrs = self.config, []
        scored = _ScoredClips(self.rewards, cfg.prompts) if self.rewards is not None else None
        reference = getattr(self.model, "has_sample_reference", False)
        audio_guidance = (
            {} if cfg.audio_guidance_scale is None else {"audio_guidance_scale": cfg.audio_guidance_scale}
        )
        for index, (prompt, seed) in enumerate(zip(cfg.prompts, cfg.prompt_seeds(), strict=True)):
            clip = as_sampled_clip(self.model.sample(
                prompt, seed=seed, num_frames=cfg.num_frames, height=cfg.height, width=cfg.width,
                steps=cfg.sampling_steps, guidance_scale=cfg.guidance_scale,
                negative_prompt=cfg.negative_prompt, shift=cfg.shift, fps=cfg.fps, **audio_guidance,
            ))  # fmt: skip
            video = clip.video
            if scored is not None:
                scored.add(index, prompt, seed, video)
            mp4 = self.out_dir / f"iter_{step:07d}" / f"{index}.mp4"
            if self.write:
                write_video(video, mp4, fps=cfg.fps)
                if clip.audio is not None:
                    write_wav(mp4.with_suffix(".wav"), clip.audio, clip.sample_rate)
            if metrics is not None:
                written = mp4 if self.write else None
                metrics.add_video(f"validation/{index}", video, step, path=written)
                if clip.audio is not None:
                    wav = written.with_suffix(".wav") if written is not None else None
                    metrics.add_audio(
                        f"validation/{index}_audio", clip.audio, clip.sample_rate, step, path=wav
                    )
            if reference:
                if index not in self.references:
                    self.references[index] = self.model.sample_reference(
                        prompt, seed=seed, num_frames=cfg.num_frames, height=cfg.height, width=cfg.width
                    )
                mse = (video.float() - self.references[index].float()).pow(2).mean()
                psnrs.append(float(10 * torch.log10(4.0 / mse.clamp_min(1e-12))))  # [-1, 1]: peak-to-peak 2
        if scored is not None and self.write:
            write_json(self.out_dir / f"iter_{step:07d}" / "rewards.json", scored.rows())
        out = {"val_psnr_to_reference": sum(psnrs) / len(psnrs)} if psnrs else {}
        return {**out, **(scored.statistics() if scored is not None else {})}

    def _loss(self) -> dict[str, float]:
        """Mean held-out losses (``val_loss``, ``val_<name>``): this rank's share of the samples, gathered
        over data-parallel ranks."""
        assert self.dataset is not None
        total = len(self.dataset)
        rounds = math.ceil(total / self.dp_size)
        rows: list[dict[str, torch.Tensor]] = []
        for r in range(rounds):
            index = min(r * self.dp_size + self.dp_rank, total - 1)  # past the end: a repeat, dropped below
            rows.append(self._sample_losses(index))
        names = sorted(rows[0])  # the same on every rank: the same model and pipeline
        local = torch.stack([torch.stack([row[n] for n in names]) for row in rows]).to(
            self.device
        )  # [round, loss]
        if self.dp_size > 1:
            parts = [torch.empty_like(local) for _ in range(self.dp_size)]
            dist.all_gather(parts, local, group=self.dp_group)
            local = torch.stack(parts, dim=1).flatten(0, 1)  # [round, dp rank, loss] -> sample order
        means = local[:total].mean(dim=0)
        return {f"val_{name}": float(value) for name, value in zip(names, means, strict=True)}

    def _sample_losses(self, index: int) -> dict[str, torch.Tensor]:
        """Held-out sample ``index``'s losses by name (``loss``, and any the model adds), fp64 scalars."""
        assert self.dataset is not None
        item = self.dataset[index]
        batch = {k: v for k, v in self.collate([item]).items() if k != "skipped"}
        batch = {k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        rng = SampleRNG(seed=self.noise_seed, step=0, sample_ids=[index], device=self.device)
        losses = self.model.validation_loss(batch, rng, self.config.loss_timesteps)
        named = losses if isinstance(losses, Mapping) else {"loss": losses}
        return {name: value[0].double() for name, value in named.items()}


class _ScoredClips:
    """Validation clips scored by the rewards a group at a time (the clips of one prompt text, scored once
    the last of them is sampled), their ``rewards.json`` rows and statistics."""

    def __init__(self, rewards: Any, prompts: list[str]) -> None:
        self.rewards = rewards
        self.group = [prompts.index(p) for p in prompts]  # a group's id: the first index of its text
        self.last = {g: i for i, g in enumerate(self.group)}
        self.pending: dict[int, list[tuple[int, str, int, torch.Tensor]]] = {}
        self.scored: dict[int, dict[str, Any]] = {}
        self.scores: list[Any] = []

    def add(self, index: int, prompt: str, seed: int, video: torch.Tensor) -> None:
        """Clip ``index`` sampled; its group is scored when it is the group's last."""
        group = self.group[index]
        self.pending.setdefault(group, []).append((index, prompt, seed, video))
        if self.last[group] == index:
            self._score(self.pending.pop(group))

    def _score(self, clips: list[tuple[int, str, int, torch.Tensor]]) -> None:
        names = [f"validation prompt {i} ({p!r}, seed {s})" for i, p, s, _ in clips]
        frames = torch.stack([video.float() for *_, video in clips])
        scores = self.rewards.score(
            [p for _, p, _, _ in clips], frames=frames, names=names, groups=[0] * len(clips)
        )
        self.scores.append(scores)
        for k, (index, prompt, seed, _) in enumerate(clips):
            row: dict[str, Any] = {"prompt": prompt, "seed": seed}
            if scores.kept[k]:
                row["reward"] = float(scores.total[k])
                row.update({f"reward_{name}": float(v[k]) for name, v in scores.each.items()})
            else:
                row["skipped"] = True
            self.scored[index] = row

    def rows(self) -> list[dict[str, Any]]:
        """Each clip's scores (``prompt``, ``seed``, ``reward``, ``reward_<id>``), in prompt order."""
        return [self.scored[i] for i in sorted(self.scored)]

    def statistics(self) -> dict[str, float]:
        """``val_reward`` (the weighted sum's mean over the kept clips) and, per reward, ``val_reward_<id>``
        (its mean) with ``_std`` (over the clips, 0 for one), ``_min`` and ``_max``; with
        ``reward_failure: skip`` also ``val_reward_skipped``, the clips left out."""
        kept = torch.cat([s.kept for s in self.scores])
        out = {"val_reward_skipped": float((~kept).sum())} if self.rewards.on_failure == "skip" else {}
        if not kept.any():
            return out
        out["val_reward"] = float(torch.cat([s.total for s in self.scores])[kept].mean())
        for name in self.scores[0].each:
            values = torch.cat([s.each[name] for s in self.scores])[kept]
            out[f"val_reward_{name}"] = float(values.mean())
            out[f"val_reward_{name}_std"] = float(values.std(correction=0))
            out[f"val_reward_{name}_min"], out[f"val_reward_{name}_max"] = (
                float(values.min()),
                float(values.max()),
            )
        return out


def write_json(path: Path, value: Any) -> None:
    """``value`` as ``path`` (JSON), whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps(value, indent=1))
    os.replace(part, path)


def _keywords(function: Any) -> set[str]:
    """The parameter names of ``function``."""
    return set(inspect.signature(function).parameters)


def _check_hooks(model: nn.Module, validation: Any) -> None:
    """Refuse a section the model cannot serve, naming the missing hook."""
    name = type(model).__name__
    if validation.prompts:
        if not callable(getattr(model, "sample", None)):
            raise ValueError(
                f"training.validation.prompts: {name} has no sample(prompt, *, seed, num_frames, height, width, "
                "steps, guidance_scale, negative_prompt, shift, fps) hook, so this model cannot sample validation "
                "clips; leave prompts empty"
            )
        check = getattr(model, "check_sampling", None)
        if callable(check):
            check()
        if validation.audio_guidance_scale is not None and "audio_guidance_scale" not in _keywords(
            model.sample
        ):
            raise ValueError(
                f"training.validation.audio_guidance_scale: {name} samples no audio (its sample hook takes no "
                "audio_guidance_scale); leave it out"
            )
    if validation.data_path is not None and not getattr(model, "has_validation_loss", False):
        raise ValueError(
            f"training.validation.data_path: {name} computes no held-out loss (its pipeline "
            f"{type(getattr(model, 'pipeline', None)).__name__} has no validation_loss(container, batch, rng, "
            "num_timesteps)); leave data_path out"
        )
