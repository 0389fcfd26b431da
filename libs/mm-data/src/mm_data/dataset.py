"""`VideoTextDataset`: clips or images + captions -> normalized video tensors and prompts."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from .bad_samples import BadSample, BadSampleError, BadSampleTracker
from .buckets import Bucket, assign_bucket, parse_buckets, same_bucket_order
from .caption_folder import CaptionError
from .captions import draw_caption, sample_rng
from .clip_info import clip_info, record_info
from .deadline import call_with_deadline
from .decode import DecodeError, VideoInfo, decode_frames, is_image, load_image, probe_video
from .frames import check_frame_rule, frame_step, sample_frame_indices
from .metadata import read_metadata

__all__ = ["VideoTextDataset", "load_clip_tensors", "to_video_tensor"]


def to_video_tensor(frames: np.ndarray) -> torch.Tensor:
    """``uint8 [T, H, W, 3]`` -> ``float32 [3, T, H, W]`` in ``[-1, 1]``."""
    if frames.ndim != 4 or frames.shape[-1] != 3:
        raise DecodeError(f"expected frames [T, H, W, 3], got shape {tuple(frames.shape)}")
    video = torch.from_numpy(np.ascontiguousarray(frames)).permute(3, 0, 1, 2)
    return video.float().div_(127.5).sub_(1.0)


class VideoTextDataset(Dataset):
    """Video (or image) + caption samples read from a metadata file, or from a caption folder (clips and
    images with a same-named ``.txt`` caption each: :mod:`mm_data.caption_folder`).

    Each item is a dict: ``video`` float ``[C, T, H, W]`` in ``[-1, 1]`` (the sample's bucket
    size), ``prompt`` (one caption, chosen at random from a list; ``""`` with probability
    ``caption_dropout``), ``index`` (the dataset index actually loaded; differs from the asked
    index when a bad sample was replaced), ``bucket`` (bucket id), ``start_s`` (time of the first
    sampled frame in the source clip, seconds; 0 for images: where a matching audio span starts),
    ``skipped`` (indices of bad samples passed over to reach this one, usually empty), and optionally
    ``first_frame`` ``[C, H, W]`` and ``input_ids`` / ``attention_mask`` ``[max_text_length]``.

    Random choices (temporal offset, caption, dropout) are drawn from ``(seed, epoch, index)``, so
    an item is reproducible in any worker and on resume; :meth:`set_epoch` varies them per epoch.
    A bad sample (undecodable, too short, wrong channels, not a regular file, not read within
    ``decode_timeout_s``: :mod:`mm_data.deadline`, or a caption folder's clip without a usable caption)
    is replaced by the next index of the same bucket, logged, counted and named in the item's
    ``skipped``; more than ``max_bad_fraction`` of the dataset seen by one process raises
    :class:`BadSampleError` listing the paths (the trainer also sums ``skipped`` over all workers and
    ranks, see ``mm_trainer.BatchStream``). A caption folder whose uncaptioned clips alone pass
    ``max_bad_fraction`` is refused when the dataset is built.
    """

    def __init__(
        self,
        metadata_path: str | Path,
        *,
        data_root: str | Path | None = None,
        num_frames: int,
        height: int,
        width: int,
        fps: float | None = None,
        frame_stride: int | None = None,
        frame_rule: str | None = "4k+1",
        buckets: Sequence[Any] | Mapping[str, Any] | None = None,
        caption_dropout: float = 0.0,
        tokenizer: Callable[..., Any] | None = None,
        max_text_length: int = 512,
        return_first_frame: bool = False,
        max_bad_fraction: float = 0.05,
        seed: int = 0,
        columns: Mapping[str, Any] | None = None,
        frame_offset: str = "random",
        decode_timeout_s: float | None = 120.0,
    ) -> None:
        frame_step(30.0, fps, frame_stride)  # validates the fps / frame_stride combination
        if decode_timeout_s is not None and not decode_timeout_s > 0:
            raise ValueError(f"decode_timeout_s must be > 0 (or None: no deadline), got {decode_timeout_s}")
        self.decode_timeout_s = decode_timeout_s
        if not 0.0 <= caption_dropout <= 1.0:
            raise ValueError(f"caption_dropout must be in [0, 1], got {caption_dropout}")
        self.metadata_path = str(metadata_path)
        self.rows = read_metadata(metadata_path, data_root=data_root, columns=columns)
        if not self.rows:
            raise ValueError(f"{metadata_path}: no samples")
        self.fps, self.frame_stride, self.frame_offset = fps, frame_stride, frame_offset
        self.caption_dropout, self.tokenizer, self.max_text_length = (
            caption_dropout,
            tokenizer,
            max_text_length,
        )
        self.return_first_frame, self.seed, self.epoch = return_first_frame, seed, 0
        default = [Bucket(height, width, num_frames)]
        self.buckets = parse_buckets(buckets, num_frames) if buckets is not None else default
        for b in self.buckets:
            check_frame_rule(b.num_frames, frame_rule, f"bucket {tuple(b)} num_frames")
        self._add_image_buckets()
        self.bucket_ids = self._assign_buckets()
        self.tracker = BadSampleTracker(len(self.rows), max_bad_fraction)
        self._refuse_uncaptioned()

    def __len__(self) -> int:
        return len(self.rows)

    def _refuse_uncaptioned(self) -> None:
        """A caption folder whose clips without a usable caption alone pass ``max_bad_fraction`` is refused
        now, listing them (they would stop the run as bad samples anyway, after reading as many)."""
        bad = [
            BadSample(i, r["path"], r["caption_error"])
            for i, r in enumerate(self.rows)
            if r.get("caption_error")
        ]
        fraction, total = self.tracker.max_bad_fraction, len(self.rows)
        if len(bad) > fraction * total:
            lines = [f"{self.metadata_path}: {len(bad)} of {total} samples have no usable caption "
                     f"(max_bad_fraction={fraction:g} allows {int(fraction * total)}):"]  # fmt: skip
            lines += [f"  [{b.index}] {b.path}: {b.reason}" for b in bad]
            raise BadSampleError("\n".join(lines), bad)

    @property
    def bad_samples(self) -> list[BadSample]:
        """Bad samples this process has skipped so far."""
        return self.tracker.bad_samples

    def set_epoch(self, epoch: int) -> None:
        """Vary random choices per epoch (called by :func:`mm_data.build_dataloader`)."""
        self.epoch = int(epoch)

    def __getitem__(self, index: int) -> dict[str, Any]:
        bucket_id = self.bucket_ids[int(index)]
        return self.tracker.first_good(
            same_bucket_order(self.bucket_ids, int(index)), lambda i: self._timed_item(i, bucket_id), self._bad,
            (DecodeError,),
        )  # fmt: skip

    def _bad(self, index: int, error: Exception) -> BadSample:
        path = self.rows[index]["path"]
        return BadSample(index, path, str(error).removeprefix(f"{path}: "))

    def sample(self, index: int) -> dict[str, Any]:
        """Row ``index`` itself, never a replacement (the latent cache encodes each row as it is).

        Raises:
            DecodeError: the row's clip cannot be read at its bucket's size, or within
                ``decode_timeout_s`` (:class:`~mm_data.deadline.SampleTimeout`).
        """
        item = self._timed_item(int(index), self.bucket_ids[int(index)])
        item["skipped"] = []
        return item

    def reading_params(self) -> dict[str, Any]:
        """What an item depends on besides its row and bucket (hashed into the latent cache's keys)."""
        return {
            "fps": self.fps, "frame_stride": self.frame_stride, "frame_offset": self.frame_offset,
            "return_first_frame": self.return_first_frame, "seed": self.seed,
            "caption_dropout": self.caption_dropout, "max_text_length": self.max_text_length,
            "tokenizer": None if self.tokenizer is None else type(self.tokenizer).__name__,
        }  # fmt: skip

    def reassign_buckets(self) -> None:
        """Assign the buckets again from the clips' facts as now stored (the latent cache calls it after
        finding clips whose bytes changed under an unchanged size and mtime: their probed sizes are
        dropped with their digests and probed again here)."""
        self.bucket_ids = self._assign_buckets()

    def check(self, indices: Sequence[int] | None = None) -> list[BadSample]:
        """Load every sample (or ``indices``) without replacement, each under the deadline; return the
        bad ones (``mm_data.check_samples`` runs this in parallel)."""
        bad = []
        for i in range(len(self)) if indices is None else indices:
            try:
                self._timed_item(i, self.bucket_ids[i])
            except DecodeError as e:
                bad.append(self._bad(i, e))
        return bad

    # -- one sample -------------------------------------------------------------------------

    def _timed_item(self, index: int, bucket_id: int) -> dict[str, Any]:
        """:meth:`_item` under ``decode_timeout_s`` (:class:`~mm_data.deadline.SampleTimeout` past it)."""
        path = self.rows[index]["path"]
        return call_with_deadline(lambda: self._item(index, bucket_id), self.decode_timeout_s, str(path))

    def _item(self, index: int, bucket_id: int) -> dict[str, Any]:
        row, bucket = self.rows[index], self.buckets[bucket_id]
        if row.get("caption_error"):
            raise CaptionError(f"{row['path']}: {row['caption_error']}")
        rng = sample_rng(self.seed, self.epoch, index)
        frames, start_s = self._frames(row, bucket, rng)
        video = to_video_tensor(frames)
        if video.shape[1] != bucket.num_frames:
            raise DecodeError(f"{row['path']}: got {video.shape[1]} frames, bucket needs {bucket.num_frames}")
        prompt = draw_caption(row["caption"], rng, self.caption_dropout)
        item: dict[str, Any] = {"video": video, "prompt": prompt}
        if self.return_first_frame:
            item["first_frame"] = video[:, 0].clone()
        if self.tokenizer is not None:
            item.update(self._tokenize(item["prompt"]))
        item["index"], item["bucket"], item["start_s"] = index, bucket_id, start_s
        return item

    def _frames(
        self, row: Mapping[str, Any], bucket: Bucket, rng: np.random.Generator
    ) -> tuple[np.ndarray, float]:
        """The bucket's frames and the source time (s) of the first one."""
        path = row["path"]
        if is_image(path):
            if bucket.num_frames != 1:
                raise DecodeError(f"{path}: an image cannot fill a {bucket.num_frames}-frame bucket")
            return load_image(path, bucket.height, bucket.width), 0.0
        info = probe_video(path)
        if info.num_frames <= 0 and row.get("num_frames"):
            info = VideoInfo(int(row["num_frames"]), info.fps, info.height, info.width)
        try:
            step = frame_step(info.fps or row.get("fps"), self.fps, self.frame_stride)
            indices = sample_frame_indices(info.num_frames, bucket.num_frames, step, self.frame_offset, rng)
        except ValueError as e:
            raise DecodeError(f"{path}: {e}") from e
        fps = info.fps or row.get("fps")
        start_s = indices[0] / float(fps) if fps else 0.0
        return decode_frames(path, indices, bucket.height, bucket.width, info), start_s

    def _tokenize(self, prompt: str) -> dict[str, torch.Tensor]:
        out = self.tokenizer(
            prompt,
            max_length=self.max_text_length,
            padding="max_length",
            truncation=True,
            return_tensors="pt",
        )
        ids = torch.as_tensor(out["input_ids"]).reshape(-1)
        mask = torch.as_tensor(out["attention_mask"]).reshape(-1)
        return {"input_ids": ids, "attention_mask": mask}

    # -- buckets ---------------------------------------------------------------------------

    def _add_image_buckets(self) -> None:
        """Images are 1-frame videos: give them 1-frame twins of the buckets so batches never mix T."""
        has_images = any(is_image(r["path"]) for r in self.rows)
        if has_images and not any(b.num_frames == 1 for b in self.buckets):
            self.buckets += [Bucket(b.height, b.width, 1) for b in self.buckets]

    def _assign_buckets(self) -> list[int]:
        video_ids = [i for i, b in enumerate(self.buckets) if b.num_frames > 1]
        image_ids = [i for i, b in enumerate(self.buckets) if b.num_frames == 1]
        if len(video_ids) <= 1 and len(image_ids) <= 1:  # nothing to choose: no probing
            vid = video_ids[0] if video_ids else image_ids[0]
            img = image_ids[0] if image_ids else vid
            return [img if is_image(r["path"]) else vid for r in self.rows]
        unknown = [r["path"] for r in self.rows if self._needs_probe(r)]
        probed = clip_info(unknown, metadata_path=self.metadata_path) if unknown else {}
        return [assign_bucket(*self._size_of(r, probed), self.buckets) for r in self.rows]

    def _needs_probe(self, row: Mapping[str, Any]) -> bool:
        h, w, n, src_fps = row.get("height"), row.get("width"), row.get("num_frames"), row.get("fps")
        if is_image(row["path"]) and h and w:
            return False
        return not (h and w and n and (src_fps or self.fps is None))

    def _size_of(
        self, row: Mapping[str, Any], probed: Mapping[str, dict[str, Any] | None]
    ) -> tuple[int, int, int | None]:
        """(height, width, sampled frames available) from metadata, else from the file header (probed
        once, in parallel, and stored beside the metadata file: :func:`mm_data.clip_info`)."""
        h, w, n, src_fps = row.get("height"), row.get("width"), row.get("num_frames"), row.get("fps")
        if is_image(row["path"]) and h and w:
            return h, w, 1
        if self._needs_probe(row):
            info = record_info(probed.get(row["path"]))
            if info is None:
                b = self.buckets[0]
                return b.height, b.width, None  # decided later: the sample is skipped as bad
            h, w, n, src_fps = h or info.height, w or info.width, n or info.num_frames, src_fps or info.fps
        try:
            step = frame_step(src_fps, self.fps, self.frame_stride)
        except ValueError:
            return h, w, None
        return h, w, int(math.floor((n - 1) / step + 1e-6)) + 1


def load_clip_tensors(metadata: str | Path, num_frames: int, height: int, width: int) -> torch.Tensor:
    """Every clip of ``metadata`` from its first frame, as one ``[N, 3, num_frames, height, width]``
    tensor in ``[-1, 1]`` (what :class:`VideoTextDataset` yields; e.g. to fit or check a VAE on them)."""
    dataset = VideoTextDataset(
        metadata, num_frames=num_frames, height=height, width=width, frame_offset="start"
    )
    return torch.stack([dataset[i]["video"] for i in range(len(dataset))])
