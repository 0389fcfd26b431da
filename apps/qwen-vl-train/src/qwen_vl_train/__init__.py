"""Qwen2.5-VL / Qwen2-VL fine-tuning plugin (multimodal plugin, packed 3-D positions, configs) and console script."""

__version__ = "0.1.0"
