"""Shipped configs: ``apps/wan22-train/configs/*.yaml`` (packaged as ``wan22_train/configs`` in wheels)."""

from __future__ import annotations

from pathlib import Path

_PACKAGED = Path(__file__).parent / "configs"
_SOURCE_TREE = Path(__file__).resolve().parents[2] / "configs"


def config_path(name: str) -> Path:
    """Path of the shipped config ``name`` (e.g. ``tiny_t2v.yaml``)."""
    for root in (_PACKAGED, _SOURCE_TREE):
        if (root / name).is_file():
            return root / name
    raise FileNotFoundError(f"no shipped config {name!r} in {_PACKAGED} or {_SOURCE_TREE}")
