"""Synthetic datasets: real small mp4 clips (PyAV, H.264) of moving coloured shapes + captions.

Used by tests, benchmarks and the apps' embedded tiny dataset. Each metadata row carries a
``kind`` (``clip``, ``index_colour``, ``corrupt``, ``too_short``, ``image``) so tests can find
the deliberately bad samples.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np
from PIL import Image

__all__ = ["make_synthetic_dataset", "index_colour_rgb", "frame_index_from_colour", "sine_tone", "write_clip"]

COLOURS = {
    "red": (220, 40, 40),
    "green": (40, 200, 60),
    "blue": (40, 80, 230),
    "yellow": (235, 220, 40),
    "magenta": (220, 50, 200),
    "cyan": (40, 210, 220),
    "white": (240, 240, 240),
    "orange": (240, 140, 30),
}
SHAPES = ("square", "circle", "triangle")
DIRECTIONS = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}
BACKGROUND = (40, 40, 40)


def index_colour_rgb(k: int) -> tuple[int, int, int]:
    """The solid colour of frame ``k`` in an index-colour clip (robust to H.264 rounding)."""
    return ((k % 16) * 16 + 8, ((k // 16) % 16) * 16 + 8, 128)


def frame_index_from_colour(rgb: Sequence[float]) -> int:
    """Invert :func:`index_colour_rgb` from a frame's mean RGB (0..255)."""
    low = int(np.clip(round((rgb[0] - 8) / 16), 0, 15))
    high = int(np.clip(round((rgb[1] - 8) / 16), 0, 15))
    return low + 16 * high


AAC_FRAME = 1024
"""Samples per AAC frame (the encoder takes whole frames)."""


def write_clip(
    path: str | Path,
    frames: np.ndarray,
    fps: int,
    gop_size: int = 8,
    *,
    audio: np.ndarray | None = None,
    sample_rate: int = 16000,
) -> None:
    """Encode ``uint8 [T, H, W, 3]`` frames as an H.264 mp4 (H and W must be even); with ``audio``
    (float ``[2, N]`` in ``[-1, 1]`` at ``sample_rate``) an AAC stereo track beside them."""
    t, h, w, _ = frames.shape
    with av.open(str(path), "w") as container:
        stream = container.add_stream(
            "libx264", rate=Fraction(fps), options={"preset": "ultrafast", "crf": "12"}
        )
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        stream.codec_context.gop_size = gop_size
        sound = container.add_stream("aac", rate=sample_rate, layout="stereo") if audio is not None else None
        for array in frames:
            for packet in stream.encode(
                av.VideoFrame.from_ndarray(np.ascontiguousarray(array), format="rgb24")
            ):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
        if sound is not None:
            _write_audio(container, sound, np.asarray(audio, dtype=np.float32), sample_rate)


def _write_audio(container: Any, stream: Any, audio: np.ndarray, sample_rate: int) -> None:
    """Mux ``audio`` ``[2, N]`` into ``stream`` in whole AAC frames (the last one zero-padded)."""
    if audio.ndim != 2 or audio.shape[0] != 2:
        raise ValueError(f"write_clip: audio must be stereo [2, N], got shape {tuple(audio.shape)}")
    padded = np.pad(audio, ((0, 0), (0, -audio.shape[1] % AAC_FRAME)))
    for start in range(0, padded.shape[1], AAC_FRAME):
        piece = np.ascontiguousarray(padded[:, start : start + AAC_FRAME])
        frame = av.AudioFrame.from_ndarray(piece, format="fltp", layout="stereo")
        frame.sample_rate, frame.pts = sample_rate, start
        for packet in stream.encode(frame):
            container.mux(packet)
    for packet in stream.encode():
        container.mux(packet)


def sine_tone(
    frequency: float, seconds: float, sample_rate: int = 16000, amplitude: float = 0.5
) -> np.ndarray:
    """A stereo sine ``[2, N]`` of ``frequency`` Hz lasting ``seconds``, both channels alike."""
    t = np.arange(int(round(seconds * sample_rate))) / sample_rate
    wave = (amplitude * np.sin(2 * np.pi * frequency * t)).astype(np.float32)
    return np.stack([wave, wave])


def _shape_mask(shape: str, h: int, w: int, cy: float, cx: float, r: float) -> np.ndarray:
    yy, xx = np.mgrid[0:h, 0:w]
    if shape == "square":
        return (np.abs(yy - cy) <= r) & (np.abs(xx - cx) <= r)
    if shape == "circle":
        return (yy - cy) ** 2 + (xx - cx) ** 2 <= r * r
    # triangle pointing up: inside when below the apex lines and above the base
    return (yy <= cy + r) & (yy - (cy - r) >= 2 * np.abs(xx - cx))


def _shape_frames(h: int, w: int, n: int, colour: str, shape: str, direction: str) -> np.ndarray:
    r = max(2.0, min(h, w) / 6)
    dx, dy = DIRECTIONS[direction]
    frames = np.empty((n, h, w, 3), np.uint8)
    for k in range(n):
        p = k / max(1, n - 1)  # 0 -> 1 over the clip
        cx = w / 2 + dx * (p - 0.5) * (w - 2 * r - 2)
        cy = h / 2 + dy * (p - 0.5) * (h - 2 * r - 2)
        frames[k] = BACKGROUND
        frames[k][_shape_mask(shape, h, w, cy, cx, r)] = COLOURS[colour]
    return frames


def _as_list(value: int | Sequence[int] | Sequence[Sequence[int]]) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def make_synthetic_dataset(
    out_dir: str | Path,
    num_clips: int = 8,
    sizes: Sequence[tuple[int, int]] = ((64, 64), (48, 80), (80, 48)),
    fps: int | Sequence[int] = (16, 8, 12),
    num_frames: int | Sequence[int] = (33, 25, 17),
    seed: int = 0,
    corrupt: int = 0,
    too_short: int = 0,
    index_colour: bool = False,
    num_images: int = 0,
    gop_size: int = 8,
    shapes: Sequence[tuple[str, str, str]] | None = None,
    tones: Sequence[float] | None = None,
    sample_rate: int = 16000,
) -> Path:
    """Write clips, optional bad samples and images into ``out_dir``; return ``metadata.json``'s path.

    Clip ``i`` uses ``sizes[i % len]``, ``fps[i % len]`` and ``num_frames[i % len]`` and shows a
    coloured shape moving in one direction (``cap`` describes colour, shape and direction). With
    ``index_colour`` every frame is one solid colour encoding its index (see :func:`index_colour_rgb`).
    ``shapes`` fixes clip ``i``'s ``(colour, shape, direction)`` to ``shapes[i % len]`` (default: drawn
    from ``seed``; see ``COLOURS``, ``SHAPES``, ``DIRECTIONS``). ``tones`` gives clip ``i`` an AAC audio
    track at ``sample_rate``: a sine of ``tones[i % len]`` Hz (:func:`sine_tone`), half a second longer than
    its frames (default: silent clips, no audio track).
    Then ``corrupt`` truncated mp4 files, ``too_short`` 5-frame clips and ``num_images`` PNGs.
    Metadata rows follow the Wan2.2 layout: ``path``, ``cap`` (list), ``num_frames``, ``fps``,
    ``resolution {height, width}``, plus ``kind``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for colour, shape, direction in shapes or ():
        if colour not in COLOURS or shape not in SHAPES or direction not in DIRECTIONS:
            raise ValueError(
                f"shapes: ({colour!r}, {shape!r}, {direction!r}) is not a (colour, shape, direction) of "
                f"{list(COLOURS)}, {list(SHAPES)}, {list(DIRECTIONS)}"
            )
    sizes, fpss, lengths = [tuple(s) for s in sizes], _as_list(fps), _as_list(num_frames)
    rows = []
    for i in range(num_clips + corrupt + too_short):
        h, w = sizes[i % len(sizes)]
        rate, n = fpss[i % len(fpss)], lengths[i % len(lengths)]
        kind = "index_colour" if index_colour else "clip"
        if i >= num_clips:
            kind = "corrupt" if i < num_clips + corrupt else "too_short"
            n = 5 if kind == "too_short" else n
        colour, shape, direction = _pick(rng)
        if shapes and i < num_clips:
            colour, shape, direction = shapes[i % len(shapes)]
        if kind == "index_colour":
            frames = np.stack([np.broadcast_to(np.uint8(index_colour_rgb(k)), (h, w, 3)) for k in range(n)])
            caps = [f"solid colours encoding frame indices 0 to {n - 1}"]
        else:
            frames = _shape_frames(h, w, n, colour, shape, direction)
            caps = _captions(colour, shape, direction)
        name = f"clip_{i:04d}.mp4"
        sound = (
            sine_tone(tones[i % len(tones)], n / rate + 0.5, sample_rate) if tones and i < num_clips else None
        )
        write_clip(out / name, frames, rate, gop_size, audio=sound, sample_rate=sample_rate)
        if kind == "corrupt":
            data = (out / name).read_bytes()
            (out / name).write_bytes(data[: len(data) // 3])  # moov atom is at the end: unreadable
        rows.append(_row(name, caps, n, rate, h, w, kind))
    for j in range(num_images):
        h, w = sizes[j % len(sizes)]
        colour, shape, _ = _pick(rng)
        name = f"image_{j:04d}.png"
        Image.fromarray(_shape_frames(h, w, 1, colour, shape, "right")[0]).save(out / name)
        rows.append(_row(name, [f"a {colour} {shape} on a dark background"], 1, None, h, w, "image"))
    path = out / "metadata.json"
    path.write_text(json.dumps(rows, indent=1))
    return path


def _pick(rng: np.random.Generator) -> tuple[str, str, str]:
    return (
        list(COLOURS)[rng.integers(len(COLOURS))],
        SHAPES[rng.integers(len(SHAPES))],
        list(DIRECTIONS)[rng.integers(len(DIRECTIONS))],
    )


def _captions(colour: str, shape: str, direction: str) -> list[str]:
    return [
        f"a {colour} {shape} moving {direction}",
        f"A {colour} {shape} slides {direction} across a dark grey background.",
    ]


def caption_vocabulary() -> list[str]:
    """Every lower-case word a synthetic caption can contain, sorted (to build tiny tokenizers)."""
    words = {
        word
        for colour, shape, direction in itertools.product(COLOURS, SHAPES, DIRECTIONS)
        for caption in _captions(colour, shape, direction)
        for word in re.findall(r"\w+", caption.lower())
    }
    return sorted(words)


def _row(name: str, caps: list[str], n: int, fps: int | None, h: int, w: int, kind: str) -> dict[str, Any]:
    row: dict[str, Any] = {"path": name, "cap": caps, "num_frames": n}
    if fps is not None:
        row["fps"] = fps
    row.update(resolution={"height": h, "width": w}, kind=kind)
    return row
