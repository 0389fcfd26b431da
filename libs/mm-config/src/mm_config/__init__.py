"""Pydantic schema of the six-section training YAML: load, override, validate, dump."""

__version__ = "0.1.0"
