"""PyAV decoding of selected frames (seek to the needed range) and image loading.

Frames are resized (to cover the target, aspect preserved) by swscale while they are
converted to RGB, then center-cropped: ``uint8`` arrays ``[T, H, W, 3]``. Every read starts with
:func:`require_regular_file`: a FIFO, device or directory listed as a sample is refused before it is
opened (opening a FIFO blocks until something writes to it).
"""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import av
import numpy as np
from av.video.reformatter import VideoReformatter
from PIL import Image

__all__ = [
    "IMAGE_EXTENSIONS",
    "DecodeError",
    "require_regular_file",
    "VideoInfo",
    "is_image",
    "probe_video",
    "decode_frames",
    "load_image",
    "cover_size",
]

# One thread per decoder and per scaler. FFmpeg's decoders and swscale start their own worker threads by
# default; a forked process (a DataLoader worker, ``mm-data check``) inherits such a context without its
# threads, and freeing it there (garbage collected in the child, or a frame of a parent's thread cleared
# at fork) waits forever on those threads' condition variables: the worker hangs for good. With one
# thread nothing is started; the parallelism is the DataLoader workers' (one decoder each), as usual.
FORK_SAFE_THREADS = 1

IMAGE_EXTENSIONS = frozenset({".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff"})


class DecodeError(RuntimeError):
    """A sample cannot be decoded (corrupt, too short, wrong channels, unreadable)."""


@dataclass(frozen=True)
class VideoInfo:
    """What a clip offers: frame count, frame rate and size."""

    num_frames: int
    fps: float
    height: int
    width: int


_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))  # fmt: skip


def require_regular_file(path: str | Path) -> None:
    """Raise :class:`DecodeError` naming ``path`` unless it is a regular file (links followed).

    ``stat`` does not open the file, so a FIFO (whose open would wait for a writer), a device or a
    directory is refused without blocking.
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise DecodeError(f"{path}: no such file") from None
    except OSError as e:
        raise DecodeError(f"{path}: cannot stat: {e.strerror or e}") from e
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
        raise DecodeError(f"{path}: {kind}, not a regular file; refused without opening it")


def is_image(path: str | Path) -> bool:
    """True when ``path`` has an image extension (images are 1-frame videos)."""
    return Path(path).suffix.lower() in IMAGE_EXTENSIONS


def _video_stream(container: av.container.InputContainer, path: str | Path) -> av.video.stream.VideoStream:
    if not container.streams.video:
        raise DecodeError(f"{path}: no video stream")
    return container.streams.video[0]


def _stream_info(container: av.container.InputContainer, stream: av.video.stream.VideoStream) -> VideoInfo:
    fps = float(stream.average_rate or stream.guessed_rate or 0) or 0.0
    frames = int(stream.frames or 0)
    if frames <= 0 and fps > 0:
        duration = None
        if stream.duration is not None and stream.time_base is not None:
            duration = float(stream.duration * stream.time_base)
        elif container.duration is not None:
            duration = container.duration / av.time_base
        frames = int(math.floor((duration or 0.0) * fps + 1e-6))
    return VideoInfo(frames, fps, stream.codec_context.height, stream.codec_context.width)


def probe_video(path: str | Path) -> VideoInfo:
    """Read frame count, fps and size from the container header (no decoding)."""
    require_regular_file(path)
    if is_image(path):
        try:
            with Image.open(path) as im:
                return VideoInfo(1, 0.0, im.height, im.width)
        except OSError as e:
            raise DecodeError(f"{path}: cannot open image: {e}") from e
    try:
        with av.open(str(path)) as container:
            return _stream_info(container, _video_stream(container, path))
    except (av.FFmpegError, OSError) as e:
        raise DecodeError(f"{path}: cannot open video: {e}") from e


def cover_size(height: int, width: int, target_h: int, target_w: int) -> tuple[int, int]:
    """Smallest (h, w) with the source aspect ratio that covers (target_h, target_w)."""
    scale = max(target_h / height, target_w / width)
    return max(target_h, round(height * scale)), max(target_w, round(width * scale))


def _center_crop(array: np.ndarray, target_h: int, target_w: int) -> np.ndarray:
    h, w = array.shape[:2]
    top, left = (h - target_h) // 2, (w - target_w) // 2
    return array[top : top + target_h, left : left + target_w]


def _frame_to_array(
    frame: av.VideoFrame, target_h: int, target_w: int, reformatter: VideoReformatter
) -> np.ndarray:
    h, w = cover_size(frame.height, frame.width, target_h, target_w)
    rgb = reformatter.reformat(
        frame, width=w, height=h, format="rgb24", interpolation="BILINEAR", threads=FORK_SAFE_THREADS
    )
    return _center_crop(rgb.to_ndarray(), target_h, target_w)


def decode_frames(
    path: str | Path, indices: Sequence[int], height: int, width: int, info: VideoInfo | None = None
) -> np.ndarray:
    """Decode the frames at ``indices`` (sorted, may repeat) as ``uint8 [T, height, width, 3]``.

    Seeks to the keyframe before the first needed frame and decodes only up to the last one;
    a frame's index is computed from its timestamp, so variable GOPs and B-frames are fine.

    Raises:
        DecodeError: the file cannot be opened/decoded or ends before the last needed frame.
    """
    if not indices:
        raise ValueError("decode_frames needs at least one frame index")
    wanted = sorted(set(int(i) for i in indices))
    require_regular_file(path)
    try:
        with av.open(str(path)) as container:
            stream = _video_stream(container, path)
            stream.codec_context.thread_count = FORK_SAFE_THREADS
            info = info or _stream_info(container, stream)
            got = _decode_wanted(container, stream, wanted, info.fps, height, width)
    except (av.FFmpegError, OSError, ValueError) as e:
        raise DecodeError(f"{path}: decode failed: {e}") from e
    missing = [i for i in wanted if i not in got]
    if missing:
        raise DecodeError(
            f"{path}: clip ended before frame {missing[0]} (decoded {len(got)} of {len(wanted)})"
        )
    return np.stack([got[int(i)] for i in indices])


def _decode_wanted(
    container: av.container.InputContainer,
    stream: av.video.stream.VideoStream,
    wanted: list[int],
    fps: float,
    height: int,
    width: int,
) -> dict[int, np.ndarray]:
    if fps <= 0:
        raise DecodeError("stream has no frame rate")
    time_base = float(stream.time_base)
    start = stream.start_time or 0
    if wanted[0] > 0:
        container.seek(
            start + int(wanted[0] / fps / time_base), stream=stream, backward=True, any_frame=False
        )
    want, last, got = set(wanted), wanted[-1], {}
    # One reformatter for the clip keeps its scaling context: a new one per frame (``frame.reformat``)
    # costs ~2 ms per frame, more than decoding a small clip.
    reformatter = VideoReformatter()
    counter = None  # fallback when a frame has no pts
    for frame in container.decode(stream):
        if frame.pts is not None:
            index = round((frame.pts - start) * time_base * fps)
        else:
            counter = 0 if counter is None else counter + 1
            index = counter
        if index in want and index not in got:
            got[index] = _frame_to_array(frame, height, width, reformatter)
        if index >= last:
            break
    return got


def load_image(path: str | Path, height: int, width: int) -> np.ndarray:
    """Load an image as ``uint8 [1, height, width, 3]`` (RGB; resized to cover, center-cropped)."""
    require_regular_file(path)
    try:
        with Image.open(path) as im:
            im = im.convert("RGB")
            h, w = cover_size(im.height, im.width, height, width)
            array = np.array(im.resize((w, h), Image.BILINEAR))
    except OSError as e:
        raise DecodeError(f"{path}: cannot read image: {e}") from e
    return _center_crop(array, height, width)[None]
