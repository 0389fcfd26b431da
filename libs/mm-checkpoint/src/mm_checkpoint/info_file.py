"""``mm_checkpoint.json``: what a save recorded about itself, read and checked in one place.

Every reader (resume, ``checkpoint_info``, export, the conversion cache) goes through :func:`read_info`,
so a corrupt or hand-edited file is one :class:`~mm_checkpoint.errors.CheckpointFormatError` naming it
and the field, never a raw ``JSONDecodeError`` / ``KeyError`` / ``TypeError`` far from the cause.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import CheckpointFormatError

INFO_FILENAME = "mm_checkpoint.json"
SUBMODELS_INFO_KEY = "submodels"
"""Key of ``mm_checkpoint.json`` listing a container checkpoint's sub-models (``save(submodels=...)``)."""
SOURCES_INFO_KEY = "sources"
"""Key of ``mm_checkpoint.json`` mapping a training run's sub-models to the folder their weights came
from (``save(info={"sources": ...})``): where an export finds the sub-model's ``config.json``."""


def _count(minimum: int) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= minimum


FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "iteration": (_count(-1), "an integer >= -1 (-1: release)"),
    "world_size": (_count(1), "an integer >= 1"),
    "dp_size": (_count(1), "an integer >= 1"),
    "time": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number"),
    SUBMODELS_INFO_KEY: (
        lambda v: isinstance(v, list) and all(isinstance(n, str) and n for n in v),
        "a list of sub-model names",
    ),
    "source": (lambda v: isinstance(v, dict), "an object (a conversion's source identity)"),
    SOURCES_INFO_KEY: (
        lambda v: (
            isinstance(v, dict) and all(isinstance(k, str) and isinstance(p, str) for k, p in v.items())
        ),
        "an object mapping sub-model names to folders",
    ),
}
"""The fields a save writes, each with its check and what it must be; other keys are kept as written."""


def read_info(dcp_dir: str | Path, *, required: tuple[str, ...] = ()) -> dict[str, Any] | None:
    """The checked ``mm_checkpoint.json`` of the DCP iteration dir ``dcp_dir``; None when there is none.

    Raises:
        CheckpointFormatError: not a JSON object, a known field of the wrong type or range, or a
            ``required`` field missing, naming the file and the field.
    """
    path = Path(dcp_dir) / INFO_FILENAME
    if not path.is_file():
        return None
    try:
        info = json.loads(path.read_text())
    except (UnicodeDecodeError, ValueError) as err:
        raise CheckpointFormatError(
            f"{path} is not valid JSON ({err}): the checkpoint's record is corrupt"
        ) from None
    if not isinstance(info, dict):
        raise CheckpointFormatError(f"{path} holds a {type(info).__name__}; expected a JSON object")
    for key, (valid, expected) in FIELDS.items():
        if key in info and not valid(info[key]):
            raise CheckpointFormatError(f"{path}: {key} is {info[key]!r}; expected {expected}")
    for key in required:
        if key not in info:
            raise CheckpointFormatError(f"{path} has no {key!r}; expected {FIELDS[key][1]}")
    return info


def update_info(dcp_dir: str | Path, **fields: Any) -> None:
    """Set ``fields`` in the ``mm_checkpoint.json`` of ``dcp_dir`` (atomically: written beside, renamed)."""
    info = read_info(dcp_dir) or {}
    path = Path(dcp_dir) / INFO_FILENAME
    tmp = path.with_name(f".{INFO_FILENAME}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({**info, **fields}, indent=2) + "\n")
    os.replace(tmp, path)


__all__ = ["FIELDS", "INFO_FILENAME", "SOURCES_INFO_KEY", "SUBMODELS_INFO_KEY", "read_info", "update_info"]
