"""Wan2.2 T2V / I2V / TI2V training plugin and console script.

Import ``wan22_train.plugin`` (or list it in ``training.plugin``) to register the Wan pieces.
"""

__version__ = "0.1.0"

from wan22_train.model import WanDiT, WanDiTConfig  # noqa: E402

__all__ = ["WanDiT", "WanDiTConfig", "__version__"]
