"""The choices of ``wan22-train export`` that its ``--help`` shows, without importing torch."""

from __future__ import annotations

from mm_checkpoint.formats import LORA_EXPORT_FORMATS

LORA_FORMATS = LORA_EXPORT_FORMATS
"""``--lora`` choices: diffusers ``load_lora_weights`` file, ComfyUI / official-Wan-names file, merged folder."""
EXPERT_CHOICES = ("high", "low", "both")
"""``--expert`` choices of an ``expert: both`` run's LoRA export: one expert's adapters, or the pair."""

__all__ = ["EXPERT_CHOICES", "LORA_FORMATS"]
