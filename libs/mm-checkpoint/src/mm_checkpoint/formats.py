"""Checkpoint format names, their aliases, and sniffing a format from a path's content."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal

from .errors import CheckpointFormatError, ContainerCheckpointError
from .layout import looks_like_dcp_checkpoint_dir

Format = Literal["dcp", "diffusers", "hf", "pth"]

LORA_EXPORT_FORMATS = ("peft", "comfyui", "merged")
"""What :func:`~mm_checkpoint.export_lora` writes: a PEFT / diffusers file, a ComfyUI file, a merged model
folder."""

FORMAT_ALIASES: dict[str, str] = {
    "auto": "auto",
    "dcp": "dcp",
    "torch_dcp": "dcp",
    "distcp": "dcp",
    "torch_distributed": "dcp",
    "diffusers": "diffusers",
    "diffuser": "diffusers",
    "hf": "hf",
    "huggingface": "hf",
    "hugging_face": "hf",
    "transformers": "hf",
    "safetensors": "safetensors",
    "hf_safetensors": "hf",
    "pth": "pth",
    "pt": "pth",
    "torch": "pth",
}
"""Accepted spellings (case-insensitive, ``-`` = ``_``). ``safetensors`` means "diffusers or hf, sniffed";
``pth`` is a ``torch.save`` state dict (a ``.pth`` / ``.pt`` file, read with ``weights_only``: :mod:`.pth_io`)."""

PTH_SUFFIXES = (".pth", ".pt")
"""File suffixes read as ``torch.save`` state dicts (:mod:`.pth_io`)."""
DIFFUSERS_WEIGHTS_PREFIX = "diffusion_pytorch_model"
HF_WEIGHTS_PREFIX = "model"


def is_pth_file(path: str | os.PathLike) -> bool:
    """True when ``path`` is a file named ``*.pth`` / ``*.pt`` (a ``torch.save`` state dict)."""
    p = Path(path)
    return p.suffix in PTH_SUFFIXES and p.is_file()


def normalize_format(declared: str | None) -> str:
    """Canonical name of a declared format: ``auto``, ``dcp``, ``diffusers``, ``hf`` or ``safetensors``."""
    if declared is None or str(declared).strip() == "":
        return "auto"
    key = str(declared).strip().lower().replace("-", "_")
    if key not in FORMAT_ALIASES:
        raise CheckpointFormatError(
            f"unknown checkpoint format {declared!r}; expected one of {sorted(FORMAT_ALIASES)}"
        )
    return FORMAT_ALIASES[key]


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _safetensors_files(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir() if p.name.endswith(".safetensors"))


def sniff_safetensors_format(path: str | os.PathLike) -> Format | None:
    """``diffusers`` or ``hf`` for a safetensors file/dir, None if there are no safetensors weights."""
    path = Path(path)
    if path.is_file():
        if not path.name.endswith(".safetensors"):
            return None
        return "diffusers" if path.name.startswith(DIFFUSERS_WEIGHTS_PREFIX) else "hf"
    if not path.is_dir():
        return None
    files = _safetensors_files(path)
    if not files:
        return None
    config = _read_json(path / "config.json")
    if any(f.startswith(DIFFUSERS_WEIGHTS_PREFIX) for f in files) or "_diffusers_version" in config:
        return "diffusers"
    return "hf"


def _describe(path: Path) -> str:
    if not path.exists():
        return "the path does not exist"
    if path.is_file():
        return f"a file named {path.name!r}"
    names = sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir())
    shown = ", ".join(names[:20]) + (f", ... ({len(names)} entries)" if len(names) > 20 else "")
    return f"entries: [{shown}]" if names else "an empty directory"


def sniff_format(path: str | os.PathLike) -> Format:
    """Sniff the format of ``path``: DCP first, then diffusers, then HF safetensors, then a ``.pth`` /
    ``.pt`` file (``pth``).

    Raises:
        CheckpointFormatError: none of them, listing what is at ``path``.
    """
    p = Path(path)
    if looks_like_dcp_checkpoint_dir(p):
        return "dcp"
    found = sniff_safetensors_format(p)
    if found is not None:
        return found
    if is_pth_file(p):
        return "pth"
    hint = ""
    if p.is_dir() and (p / "model_index.json").is_file():
        from .key_map_registry import known_model_types

        folders = sorted(c.name for c in p.iterdir() if c.is_dir())
        components = [c for c in folders if sniff_safetensors_format(p / c)] or folders
        raise ContainerCheckpointError(
            f"{p} is a diffusers pipeline root with sub-models {components}: point at one of their folders "
            f"(e.g. {p / (components[0] if components else 'transformer')}/) and pass --model-type for its "
            f"key layout where it needs one (known model types: {known_model_types()})"
        )
    if p.is_dir() and any(x.suffix in {".bin", ".pt", ".pth"} for x in p.iterdir()):
        hint = " (a .pth / .pt state dict is read when the path names the file itself; .bin is not supported)"
    raise CheckpointFormatError(
        f"{p} is not a DCP, diffusers or HF safetensors checkpoint, nor a .pth state dict; {_describe(p)}{hint}"
    )


def resolve_load_format(path: str | os.PathLike, declared: str | None = "auto") -> Format:
    """Normalize ``declared`` and, for ``auto`` (or ``safetensors``), sniff it from ``path``.

    A declared ``dcp`` is kept even when ``path`` is not DCP yet: that is the online-conversion request.
    """
    fmt = normalize_format(declared)
    if fmt == "auto":
        return sniff_format(path)
    if fmt == "safetensors":
        found = sniff_safetensors_format(path)
        if found is None:
            raise CheckpointFormatError(
                f"declared format 'safetensors' but {path} has none; {_describe(Path(path))}"
            )
        return found
    return fmt  # type: ignore[return-value]
