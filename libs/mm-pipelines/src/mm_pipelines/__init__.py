"""Generative training pipelines: the pipeline base, the flow-match scheduler, T2V/I2V pipelines."""

__version__ = "0.1.0"
