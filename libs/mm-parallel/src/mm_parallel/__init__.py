"""Devices, ParallelState meshes, declarative FSDP2 plans, and Ulysses / Ring / USP context-parallel attention."""

__version__ = "0.1.0"
