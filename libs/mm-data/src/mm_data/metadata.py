"""Metadata readers: one row per sample, normalized to canonical keys.

A row read from JSON (a list), JSONL, CSV or Parquet becomes a dict with

- ``path``: absolute path of the clip or image (relative paths resolved against ``data_root``,
  default: the metadata file's folder),
- ``caption``: a string or a list of strings (the dataset picks one at random),
- optional ``num_frames``, ``fps``, ``height``, ``width`` (a Wan-style ``resolution``
  ``{"height": .., "width": ..}`` is flattened into ``height``/``width``),
- every other column unchanged.

A folder instead of a file is a caption folder (:mod:`mm_data.caption_folder`): each clip or image in it
with a same-named ``.txt`` caption beside it is a row, in sorted order.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .caption_folder import VIDEO_EXTENSIONS, read_caption_folder
from .decode import IMAGE_EXTENSIONS

__all__ = ["MetadataError", "read_metadata", "DEFAULT_COLUMNS"]

# canonical key -> source column names tried in order
DEFAULT_COLUMNS: dict[str, tuple[str, ...]] = {
    "path": ("path", "file", "video", "image", "file_path", "video_path"),
    "caption": ("cap", "caption", "prompt", "text"),
    "num_frames": ("num_frames", "frames"),
    "fps": ("fps", "frame_rate"),
    "height": ("height",),
    "width": ("width",),
}
_REQUIRED = ("path", "caption")


class MetadataError(ValueError):
    """A metadata file cannot be read or one of its rows lacks a required field."""


def read_metadata(
    path: str | Path,
    data_root: str | Path | None = None,
    columns: Mapping[str, str | list[str] | tuple[str, ...]] | None = None,
) -> list[dict[str, Any]]:
    """Read a metadata file (``.json``, ``.jsonl``, ``.csv``, ``.parquet``), or a caption folder, into
    canonical rows.

    Args:
        path: The metadata file, or a folder of clips / images with a same-named ``.txt`` caption each
            (:func:`mm_data.caption_folder.read_caption_folder`: rows in sorted order, a sample without a
            usable caption marked ``caption_error``).
        data_root: Folder that relative sample paths are resolved against
            (default: the metadata file's folder).
        columns: Overrides of the source column name(s) per canonical key, e.g.
            ``{"path": "video_file", "caption": "text"}``.

    Raises:
        MetadataError: unreadable file, unknown format, or a row missing ``path``/``caption``
            (the message names the file, the row and the columns looked for); a caption folder with
            ``data_root`` or ``columns`` (they apply to metadata files) or without any clip or image.
    """
    path = Path(path)
    if path.is_dir():
        return _read_folder(path, data_root, columns)
    if not path.is_file():
        raise MetadataError(f"metadata file not found: {path}")
    root = Path(data_root) if data_root is not None else path.parent
    names = _column_names(columns)
    rows = _read_rows(path)
    return [_normalize(row, i, path, root, names) for i, row in enumerate(rows)]


def _read_folder(path: Path, data_root: Any, columns: Any) -> list[dict[str, Any]]:
    for name, value in (("data_root", data_root), ("columns", columns)):
        if value is not None:
            raise MetadataError(
                f"{path} is a caption folder (clips with a .txt caption each): {name}={value!r} applies to a "
                "metadata file's rows only; remove it"
            )
    rows = read_caption_folder(path)
    if not rows:
        kinds = " ".join(sorted(VIDEO_EXTENSIONS | IMAGE_EXTENSIONS))
        raise MetadataError(
            f"{path}: a folder, read as a caption folder, but it holds no clip or image ({kinds}); "
            "expected clips with a same-named .txt caption each, or a metadata file"
        )
    return rows


def _column_names(columns: Mapping[str, Any] | None) -> dict[str, tuple[str, ...]]:
    names = dict(DEFAULT_COLUMNS)
    for key, value in (columns or {}).items():
        if key not in names:
            raise MetadataError(
                f"unknown canonical column {key!r} in columns; expected one of {sorted(names)}"
            )
        names[key] = (value,) if isinstance(value, str) else tuple(value)
    return names


def _read_rows(path: Path) -> list[dict[str, Any]]:
    suffix = path.suffix.lower()
    try:
        if suffix == ".json":
            data = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(data, dict) and isinstance(data.get("data"), list):
                data = data["data"]
            if not isinstance(data, list):
                raise MetadataError(f"{path}: expected a JSON list of objects, got {type(data).__name__}")
            return data
        if suffix == ".jsonl":
            lines = path.read_text(encoding="utf-8").splitlines()
            return [json.loads(line) for line in lines if line.strip()]
        if suffix == ".csv":
            with path.open(newline="", encoding="utf-8") as f:
                return [dict(r) for r in csv.DictReader(f)]
        if suffix == ".parquet":
            return _read_parquet(path)
    except (json.JSONDecodeError, UnicodeDecodeError, csv.Error) as e:
        raise MetadataError(f"{path}: cannot parse metadata: {e}") from e
    raise MetadataError(
        f"{path}: unknown metadata format {suffix!r}; expected .json, .jsonl, .csv or .parquet"
    )


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise MetadataError(f"{path}: reading Parquet needs pyarrow (pip install 'mm-data[parquet]')") from e
    return pq.read_table(path).to_pylist()


def _normalize(row: Any, i: int, file: Path, root: Path, names: dict[str, tuple[str, ...]]) -> dict[str, Any]:
    if not isinstance(row, Mapping):
        raise MetadataError(f"{file}: row {i}: expected an object, got {type(row).__name__}")
    out: dict[str, Any] = {}
    used: set[str] = set()
    for key, candidates in names.items():
        for name in candidates:
            if name in row and row[name] is not None and row[name] != "":
                out[key] = row[name]
                used.add(name)
                break
        else:
            if key in _REQUIRED:
                raise MetadataError(
                    f"{file}: row {i}: missing required field {key!r} (looked for columns {list(candidates)})"
                )
    resolution = row.get("resolution")
    if isinstance(resolution, Mapping):
        used.add("resolution")
        out.setdefault("height", resolution.get("height"))
        out.setdefault("width", resolution.get("width"))
    for key in ("num_frames", "height", "width"):
        if out.get(key) is not None:
            out[key] = _as_number(out[key], int, file, i, key)
    if out.get("fps") is not None:
        out["fps"] = _as_number(out["fps"], float, file, i, "fps")
    out["caption"] = _caption(out["caption"], file, i)
    sample = Path(str(out["path"]))
    out["path"] = str(sample if sample.is_absolute() else (root / sample))
    out.update({k: v for k, v in row.items() if k not in used and k not in out})
    return out


def _as_number(value: Any, kind: type, file: Path, i: int, key: str) -> Any:
    try:
        return kind(float(value)) if kind is int else kind(value)
    except (TypeError, ValueError) as e:
        raise MetadataError(f"{file}: row {i}: field {key!r} = {value!r} is not a number") from e


def _caption(value: Any, file: Path, i: int) -> str | list[str]:
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
        return list(value)
    raise MetadataError(
        f"{file}: row {i}: caption must be a string or a non-empty list of strings, got {value!r}"
    )
