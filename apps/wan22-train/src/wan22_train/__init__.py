"""Wan2.2 T2V / I2V / TI2V training plugin and console script."""

__version__ = "0.1.0"
