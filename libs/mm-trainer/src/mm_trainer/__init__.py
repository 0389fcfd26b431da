"""The model-agnostic FSDP2 trainer: registries, model hubs and containers, features, TrainEngine, resume, metrics."""

__version__ = "0.1.0"
