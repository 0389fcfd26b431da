"""IC-LoRA reference clips of an LTX-2 source: named in the metadata, checked, hashed and encoded by ``preprocess``.

A metadata row names its reference clip in the column :data:`REFERENCE_COLUMN` (``reference``), a path
resolved as the row's own clip path is (against ``data.dataset.preprocess.source_root``, else the
metadata file's folder). Either every row names one or none does (a micro-batch holds one kind). A
reference is the target's context frame for frame: it must hold exactly ``num_frames`` frames at the rate
its target is cached at (``data.dataset.preprocess.fps`` when set, else the target clip's own), and is
decoded whole at the configured size; its frames pair with the target's cached window (the target's first
``num_frames`` with ``frame_offset: start``). Its audio (its track, else the stand-in tone of its content)
spans the same seconds. :func:`check_references` refuses every row that breaks this, each with its file
and both values, before any encoder loads.

The cache stays content-keyed: :func:`key_references` writes each reference's SHA-256 into its row
(``reference_sha256``), which the sample key covers (``mm_data.cache_plan.sample_keys`` keys a row by every
field but its path), so a rewritten reference is encoded again with its target.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from mm_data import VideoTextDataset, clip_digests, decode_frames, probe_video, to_video_tensor
from mm_trainer import SampleFramesError

from ltx2_train.audio import clip_waveform
from ltx2_train.config_schema import PreprocessOptions

REFERENCE_COLUMN = "reference"
"""The metadata column naming a row's IC-LoRA reference clip."""


def reference_paths(dataset: VideoTextDataset, options: PreprocessOptions) -> list[str | None]:
    """Each row's reference clip, resolved as its clip path is; None where the row names none."""
    root = Path(options.source_root) if options.source_root else Path(dataset.metadata_path).parent
    out: list[str | None] = []
    for row in dataset.rows:
        value = row.get(REFERENCE_COLUMN)
        path = Path(str(value)) if value not in (None, "") else None
        out.append(None if path is None else str(path if path.is_absolute() else root / path))
    return out


def reference_problems(
    dataset: VideoTextDataset, options: PreprocessOptions, rate_of: Any
) -> list[str]:  # fmt: skip
    """One line per row whose reference cannot pair with its target (module docstring): none named while
    others are, a missing file, another frame count or frame rate. ``rate_of(row)`` is the rate the
    row's target is cached at."""
    paths = reference_paths(dataset, options)
    if all(p is None for p in paths):
        return []
    lines = []
    for i, (row, path) in enumerate(zip(dataset.rows, paths, strict=True)):
        if path is None:
            lines.append(
                f"  sample {i} ({row['path']}): names no reference (other rows do; expected every row)"
            )
            continue
        problem = reference_clip_problem(path, options.num_frames, float(rate_of(row)))
        if problem is not None:
            lines.append(f"  sample {i}: {problem} (data.dataset.preprocess.num_frames; the rate: "
                         "data.dataset.preprocess.fps, else the target clip's)")  # fmt: skip
    return lines


def reference_clip_problem(path: str, num_frames: int, rate: float) -> str | None:
    """Why the clip at ``path`` cannot be the reference of a target of ``num_frames`` frames at ``rate`` fps
    (missing, another frame count, another rate), or None."""
    if not Path(path).is_file():
        return f"reference {path} not found"
    info = probe_video(path)
    problems = []
    if info.num_frames != num_frames:
        problems.append(f"has {info.num_frames} frames where {num_frames} are asked")
    if not math.isclose(info.fps, rate, rel_tol=1e-3):
        problems.append(f"runs at {info.fps:g} fps where its target is at {rate:g} fps")
    return f"reference {path} " + " and ".join(problems) if problems else None


def check_references(dataset: VideoTextDataset, options: PreprocessOptions, rate_of: Any) -> bool:
    """Refuse a source whose references cannot pair with their targets (:func:`reference_problems`), naming
    every such row; whether the source has references.

    Raises:
        mm_trainer.SampleFramesError: each row's problem (exit 66), before any encoder loads.
    """
    lines = reference_problems(dataset, options, rate_of)
    if lines:
        head = (f"{dataset.metadata_path}: IC-LoRA reference clips (column '{REFERENCE_COLUMN}') that cannot pair "
                f"with their targets ({len(lines)} problem(s)):")  # fmt: skip
        raise SampleFramesError("\n".join([head, *lines]))
    return any(p is not None for p in reference_paths(dataset, options))


def key_references(dataset: VideoTextDataset, options: PreprocessOptions) -> None:
    """Write each reference's SHA-256 into its row (``reference_sha256``), so that the cache keys a sample by
    its reference's content too."""
    paths = reference_paths(dataset, options)
    records, _ = clip_digests([p for p in paths if p is not None], metadata_path=None)
    for row, path in zip(dataset.rows, paths, strict=True):
        if path is not None:
            row["reference_sha256"] = (records[path] or {})["sha256"]


def encode_reference(
    encoders: Any, path: str, digest: str, *, num_frames: int, height: int, width: int, rate: float,
    missing_audio: str = "refuse",
) -> dict[str, Any]:  # fmt: skip
    """``reference_latents [C, F, H, W]`` (and with the audio VAE ``reference_audio_latents [C, L, M]``), by
    ``encoders`` (the run's :class:`ltx2_train.preprocess.LTX2Encoders`; not imported here: preprocess imports
    this module), of
    the reference clip at ``path``: its ``num_frames`` frames at ``height`` x ``width``, its audio over their
    span at ``rate`` fps (a silent reference as ``missing_audio`` says, as a target clip: refused, zeros, or
    the stand-in tone of ``digest``, its SHA-256)."""
    frames = decode_frames(path, list(range(num_frames)), height, width)
    out = {"reference_latents": encoders.encode_video(to_video_tensor(frames))}
    if encoders.audio_vae is not None:
        wave = clip_waveform(path, sample_rate=encoders.audio_vae.config.sample_rate, seconds=num_frames / rate,
                             missing=missing_audio, tone=int(digest[:8], 16))  # fmt: skip
        out["reference_audio_latents"] = encoders.encode_audio(wave)
    return {k: v.cpu() for k, v in out.items()}
