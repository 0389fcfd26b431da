"""A folder of clips (and images) with a same-named ``.txt`` caption beside each, read as metadata rows.

``clips/dog.mp4`` + ``clips/dog.txt`` is one sample: its caption is the text file's whole content (UTF-8,
leading and trailing white space stripped). The folder is searched recursively; names starting with
``.`` (hidden files and folders, such as the probed clip facts :mod:`mm_data.clip_info` keeps in
``.clips.json``) are skipped, and so are files of other types (a ``.txt`` without a clip is no sample).
Samples are ordered by their path relative to the folder (sorted), so the folder gives the sample ids a
metadata file listing the same clips in that order gives, and the same buckets.

A clip whose caption is missing, empty, not UTF-8 or unreadable is kept as a row, marked with
``caption_error`` (the reason): :class:`~mm_data.VideoTextDataset` treats it as a bad sample (logged with
the clip's path, replaced by the next clip of its bucket, counted against ``max_bad_fraction``, listed by
``mm-data check``), and refuses the whole folder at once when such clips alone pass ``max_bad_fraction``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .decode import IMAGE_EXTENSIONS, DecodeError

__all__ = [
    "CAPTION_SUFFIX",
    "CaptionError",
    "VIDEO_EXTENSIONS",
    "caption_path",
    "read_caption",
    "read_caption_folder",
]

VIDEO_EXTENSIONS = frozenset({".mp4", ".mov", ".mkv", ".webm", ".avi", ".m4v", ".mpg", ".mpeg", ".ts"})
"""Suffixes (lower case) of the clips a caption folder holds; images: ``mm_data.decode.IMAGE_EXTENSIONS``."""
CAPTION_SUFFIX = ".txt"


class CaptionError(DecodeError):
    """A sample of a caption folder has no usable caption (a bad sample, like an undecodable clip)."""


def caption_path(media: str | Path) -> Path:
    """The caption file of a clip or image: the same name with the ``.txt`` suffix."""
    return Path(media).with_suffix(CAPTION_SUFFIX)


def read_caption(media: str | Path) -> tuple[str, str | None]:
    """``(caption, None)`` for a clip or image with a usable caption file, else ``("", why not)``."""
    path = caption_path(media)
    try:
        text = path.read_bytes().decode("utf-8-sig").strip()
    except FileNotFoundError:
        return "", f"no caption file {path.name} beside it"
    except UnicodeDecodeError as e:
        return "", f"caption file {path.name} is not UTF-8 ({e.reason} at byte {e.start})"
    except OSError as e:
        return "", f"cannot read caption file {path.name}: {e.strerror or e}"
    if not text:
        return "", f"caption file {path.name} is empty"
    return text, None


def _is_media(name: str) -> bool:
    suffix = os.path.splitext(name)[1].lower()
    return suffix in VIDEO_EXTENSIONS or suffix in IMAGE_EXTENSIONS


def _media_files(folder: Path) -> list[Path]:
    """Every clip or image under ``folder`` (hidden names skipped), sorted by relative path."""
    found: list[tuple[tuple[str, ...], Path]] = []
    for root, dirs, files in os.walk(folder, followlinks=True):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            if not name.startswith(".") and _is_media(name):
                path = Path(root) / name
                found.append((path.relative_to(folder).parts, path))
    return [path for _, path in sorted(found)]


def read_caption_folder(folder: str | Path) -> list[dict[str, Any]]:
    """The rows of a caption folder, as :func:`mm_data.read_metadata` gives them for a metadata file:
    ``path`` (absolute) and ``caption``, plus ``caption_error`` on a sample without a usable caption
    (an empty list for a folder without clips or images)."""
    folder = Path(folder).absolute()
    rows = []
    for media in _media_files(folder):
        caption, error = read_caption(media)
        row: dict[str, Any] = {"path": str(media), "caption": caption}
        if error is not None:
            row["caption_error"] = error
        rows.append(row)
    return rows
