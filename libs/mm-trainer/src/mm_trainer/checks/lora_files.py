"""A run's check of the LoRA files it starts from (``lora.init_from``), before any weight is read.

Set from a file, a sub-model's adapters are set after its base weights have loaded (they live on the
sharded, materialized model): a file of another model or release (an LTX-2.3 LoRA on a 2.0 transformer)
would be found out only then, minutes into a real-size run. Which adapters a run puts into a sub-model
depends on its module tree and its ``lora`` section alone, so this check builds the container on the meta
device (no weight read), injects the adapters as the run does (:func:`mm_trainer.model.lora.inject_lora`)
and compares each file's layer names and A / B shapes, read from its safetensors header (no tensor data),
with them (:func:`mm_trainer.model.lora.check_lora_file`): the same :class:`LoraFileError` as the load
would raise, naming the file, its first mismatching layers and what the sub-model is. A run without
``init_from`` builds nothing here.
"""

from __future__ import annotations

from typing import Any

from mm_trainer.model.build import build_meta_container
from mm_trainer.model.lora import check_lora_file, inject_lora

__all__ = ["check_lora_files"]


def check_lora_files(config: Any) -> None:
    """Refuse a run whose ``lora.init_from`` files do not fit the adapters its config puts into the model.

    Raises:
        mm_trainer.LoraFileError: a file's layers or A / B shapes are not the sub-model's adapters (exit 66).
        mm_checkpoint.CheckpointFormatError: a file is no LoRA file (exit 66).
    """
    sections = {
        name: sub.lora
        for name, sub in config.model.sub_models().items()
        if sub.lora is not None and sub.lora.init_from is not None
    }
    if not sections:
        return
    container = build_meta_container(config)
    adapters = inject_lora(container, sections)
    for name, targets in adapters.targets.items():
        check_lora_file(getattr(container, name), targets)
