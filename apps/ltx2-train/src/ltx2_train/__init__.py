"""LTX-2 audio+video training plugin and console script."""

__version__ = "0.1.0"
