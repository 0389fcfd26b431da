"""Wan2.2 T2V / I2V / TI2V training plugin and console script.

Import ``wan22_train.plugin`` (or list it in ``training.plugin``) to register the Wan pieces.
"""

from typing import Any

__version__ = "0.1.0"

__all__ = ["WanDiT", "WanDiTConfig", "__version__"]


def __getattr__(name: str) -> Any:
    """``WanDiT`` / ``WanDiTConfig`` on first use: importing the package (e.g. its torch-free
    ``config_schema`` for ``mm-config check``) does not import torch."""
    if name in ("WanDiT", "WanDiTConfig"):
        from wan22_train import model

        return getattr(model, name)
    raise AttributeError(f"module 'wan22_train' has no attribute {name!r}")
