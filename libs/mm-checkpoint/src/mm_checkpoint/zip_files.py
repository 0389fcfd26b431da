"""Telling what is wrong with a ``torch.save`` file (a zip archive) in words that name it.

torch reads its zip files with miniz, whose errors ("PytorchStreamReader failed reading zip archive:
failed finding central directory. This is an internal miniz error...") name neither the file nor what
happened to it, and it never checks the CRC-32 the archive records for each of its records. Here:
:func:`zip_damage` says whether a file is a whole zip archive, a truncated one (it begins as a zip but its
end, the central directory, is missing), or one whose structure is damaged, and :func:`check_zip_crcs`
reads every record and compares it with its recorded CRC-32 (for small files: the per-rank state).
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

from .errors import CheckpointIntegrityError

ZIP_MAGIC = b"PK\x03\x04"
"""The first bytes of a zip archive (its first local file header): what ``torch.save`` writes."""


def zip_damage(path: str | os.PathLike) -> str | None:
    """What is wrong with the zip archive ``path`` in words, None when its structure reads whole (a file
    that does not begin as a zip archive is not judged here: None)."""
    path = Path(path)
    with open(path, "rb") as f:
        head = f.read(len(ZIP_MAGIC))
    if head != ZIP_MAGIC:
        return None
    if not zipfile.is_zipfile(path):
        return (
            f"it begins as a zip archive but its end (the central directory) is missing: the file is truncated "
            f"({path.stat().st_size} bytes; an interrupted copy, download or save?)"
        )
    try:
        with zipfile.ZipFile(path) as archive:
            archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as err:
        return f"its zip structure is corrupted ({err})"
    return None


def check_zip_crcs(path: str | os.PathLike) -> None:
    """Read every record of the zip archive ``path`` against its recorded CRC-32.

    Raises:
        CheckpointIntegrityError: truncated, a damaged structure, or a record whose bytes changed; names
            the file and the record.
    """
    path = Path(path)
    damage = zip_damage(path)
    if damage is not None:
        raise CheckpointIntegrityError(f"{path}: {damage}", path=path)
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, RuntimeError) as err:
        raise CheckpointIntegrityError(f"{path}: its zip structure is corrupted ({err})", path=path) from None
    if bad is not None:
        raise CheckpointIntegrityError(
            f"{path}: record {bad!r} fails its CRC-32 check: the file is corrupted", path=path, key=bad
        )


__all__ = ["ZIP_MAGIC", "check_zip_crcs", "zip_damage"]
