"""Weight loading (HF / diffusers safetensors, torch DCP), table-driven key maps, online DCP conversion, distributed checkpointing and export."""

__version__ = "0.1.0"
