"""Fit a small autoencoder (a diffusers VAE) to reconstruct a handful of samples, on one process.

For tiny model sets: a randomly initialised VAE decodes anything to noise, so a predictor trained
on its latents can never draw a recognisable clip. A short fit on the very samples the predictor will
be trained on makes ``decode(encode(x))`` resemble ``x``.

The model is any diffusers-style autoencoder: ``encode(x).latent_dist`` (a diagonal Gaussian with
``mean``) and ``decode(z).sample``. The fit minimises ``MSE + L1`` of ``decode(mean)`` against the
input (no KL term: the posterior mean is the latent the predictor is trained on, and a few hundred
steps leave no room for sampling noise; ``l1_weight=0`` leaves plain MSE) with Adam, a linear warmup over the first 5 % of the steps
and a cosine decay after; mini-batches drawn from ``seed``.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from mm_data import psnr

from mm_trainer.tools.progress import Progress

__all__ = [
    "FIT_REPORT",
    "AutoencoderFit",
    "fit_autoencoder",
    "fit_or_reuse_autoencoder",
    "fit_report",
    "fit_summary",
    "latent_statistics",
    "posterior_means",
    "reconstruct",
    "save_fitted",
]

#: The report a fitted model's folder carries; a folder without it is not complete.
FIT_REPORT = "fit.json"


@dataclass(frozen=True)
class AutoencoderFit:
    """What a fit did: steps, wall seconds and the last mini-batch loss (NaN after 0 steps)."""

    steps: int
    seconds: float
    final_loss: float

    def report(self, samples: int, **quality: float) -> dict[str, Any]:
        """The ``fit.json`` body: the ``quality`` figures (rounded), steps, seconds, sample count."""
        rounded = {name: round(value, 2) for name, value in quality.items()}
        return {**rounded, "fit_steps": self.steps, "fit_seconds": round(self.seconds, 1), "samples": samples}


def fit_autoencoder(
    model: Any,
    samples: torch.Tensor,
    *,
    steps: int,
    lr: float = 3e-3,
    batch_size: int = 2,
    seed: int = 0,
    l1_weight: float = 1.0,
    progress: str | None = None,
) -> AutoencoderFit:
    """Train ``model`` (in place, left in eval mode) to reconstruct ``samples`` ``[N, ...]``; ``steps=0``
    leaves it as it is.

    Deterministic for a seed on one device: mini-batch indices come from a generator seeded with
    ``seed``; the caller seeds the model's initialisation. The loss is ``MSE + l1_weight * L1``.
    ``progress``: a label under which the steps show (:class:`~mm_trainer.tools.progress.Progress`:
    a bar on a terminal, else a line every 10 s); None: silent.
    """
    if steps < 0:
        raise ValueError(f"fit_autoencoder: steps must be >= 0, got {steps}")
    if samples.shape[0] < 1:
        raise ValueError("fit_autoencoder: no samples")
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: _lr_factor(step, steps))
    model.train()
    start = time.monotonic()
    loss = torch.tensor(float("nan"))
    bar = Progress(progress or "", steps, "steps", enabled=progress is not None)
    for _ in range(steps):
        index = torch.randint(0, samples.shape[0], (min(batch_size, samples.shape[0]),), generator=generator)
        batch = samples[index]
        error = _decode(model, _encode(model, batch)) - batch
        loss = error.pow(2).mean() + l1_weight * error.abs().mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        bar.advance()
    bar.close()
    model.eval()
    return AutoencoderFit(steps=steps, seconds=time.monotonic() - start, final_loss=float(loss.detach()))


def _lr_factor(step: int, steps: int) -> float:
    """Linear warmup over the first 5 % of ``steps``, then a cosine decay to 0."""
    warmup = max(1, steps // 20)
    return min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * step / max(steps, 1)))


@torch.no_grad()
def reconstruct(model: Any, samples: torch.Tensor, batch_size: int = 8) -> torch.Tensor:
    """``decode(encode(x).latent_dist.mode())`` of every sample, in mini-batches."""
    return torch.cat([_decode(model, _encode(model, x)) for x in samples.split(batch_size)])


@torch.no_grad()
def posterior_means(model: Any, samples: torch.Tensor, batch_size: int = 8) -> torch.Tensor:
    """``encode(x).latent_dist.mean`` of every sample, in mini-batches."""
    return torch.cat([_encode(model, x) for x in samples.split(batch_size)])


def latent_statistics(latents: torch.Tensor, channel_dim: int = 1) -> tuple[list[float], list[float]]:
    """Per-channel mean and standard deviation of ``latents`` over every other dim: the normalisation
    that gives a predictor zero-mean, unit-variance latents."""
    dims = [d for d in range(latents.ndim) if d != channel_dim % latents.ndim]
    return latents.mean(dim=dims).tolist(), latents.std(dim=dims).clamp_min(1e-6).tolist()


def _encode(model: Any, x: torch.Tensor) -> torch.Tensor:
    return model.encode(x).latent_dist.mean


def _decode(model: Any, z: torch.Tensor) -> torch.Tensor:
    return model.decode(z).sample


def save_fitted(model: Any, folder: str | Path, report: dict[str, Any]) -> Path:
    """``model.save_pretrained`` into ``folder`` with ``report`` as its ``fit.json``, atomically: written
    to ``<folder>.partial`` and renamed, so a killed run leaves no folder that looks complete."""
    folder = Path(folder)
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    (partial / FIT_REPORT).write_text(json.dumps(report, indent=1) + "\n")
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    return folder


def fit_report(folder: str | Path) -> dict[str, Any] | None:
    """The ``fit.json`` of a folder written by :func:`save_fitted`, or None when there is none."""
    path = Path(folder) / FIT_REPORT
    if not (path.is_file() and (Path(folder) / "config.json").is_file()):
        return None
    return json.loads(path.read_text())


def fit_or_reuse_autoencoder(
    build: Callable[[], Any],
    folder: str | Path,
    samples: torch.Tensor,
    *,
    steps: int,
    seed: int,
    set_statistics: Callable[[Any, list[float], list[float]], None],
    fit_samples: torch.Tensor | None = None,
    progress: str | None = "fitting the tiny VAE",
    **fit: Any,
) -> dict[str, Any]:
    """Fit ``build()`` to reconstruct ``samples`` (``[N, 3, ...]`` in ``[-1, 1]``) and save it into
    ``folder`` with its report, unless ``folder`` holds a fit of the same steps, seed, ``fit``
    keywords and samples (the SHA-256 of ``samples`` and ``fit_samples``) already; returns the report:
    ``psnr_db`` of the samples' reconstruction, ``fit_steps``, ``fit_seconds``, ``samples`` and the
    reuse key (``seed``, ``fit``, ``samples_sha256``).

    The model is built after ``torch.manual_seed(seed)`` and fitted (:func:`fit_autoencoder`, keywords
    ``fit``) on ``fit_samples`` (default ``samples``; e.g. single frames of the clips) on one thread;
    ``set_statistics(model, mean, std)`` then records the per-channel :func:`latent_statistics` of the
    samples' posterior means where the model keeps them (config or buffers). ``progress`` labels the
    fit's progress (None: silent; not part of the reuse key).
    """
    folder = Path(folder)
    key = _fit_key(
        samples if fit_samples is None else (samples, fit_samples), steps=steps, seed=seed, fit=fit
    )
    cached = fit_report(folder)
    if cached is not None and all(cached.get(k) == v for k, v in key.items()):
        return cached
    torch.manual_seed(seed)
    model = build()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # ops this small gain nothing from more; on a busy machine they lose a lot
    try:
        done = fit_autoencoder(
            model,
            samples if fit_samples is None else fit_samples,
            steps=steps,
            seed=seed,
            progress=progress,
            **fit,
        )
    finally:
        torch.set_num_threads(threads)
    set_statistics(model, *latent_statistics(posterior_means(model, samples)))
    report = done.report(len(samples), psnr_db=psnr(reconstruct(model, samples).clamp(-1, 1), samples)) | key
    save_fitted(model, folder, report)
    return report


def _fit_key(
    samples: torch.Tensor | tuple[torch.Tensor, ...], *, steps: int, seed: int, fit: Mapping[str, Any]
) -> dict[str, Any]:
    """What a saved fit must match to be reused: steps, seed, the fit keywords (JSON, as ``fit.json``
    reads them back) and the SHA-256 of the samples' shapes and bytes."""
    digest = hashlib.sha256()
    for tensor in samples if isinstance(samples, tuple) else (samples,):
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    keywords = json.loads(json.dumps(dict(sorted(fit.items()))))
    return {"fit_steps": steps, "seed": seed, "fit": keywords, "samples_sha256": digest.hexdigest()}


def fit_summary(folder: str | Path) -> str:
    """One line on how well the autoencoder in ``folder`` reconstructs its samples (its ``fit.json``)."""
    report = fit_report(folder)
    if report is None:
        return f"tiny VAE: random weights (not fitted; {folder} has no {FIT_REPORT})"
    return (
        f"tiny VAE reconstruction PSNR on the {report['samples']} clips: {report['psnr_db']:.2f} dB "
        f"({report['fit_steps']} fit steps, {report['fit_seconds']} s)"
    )
