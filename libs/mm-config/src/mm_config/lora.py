"""``model.[models.<name>.]lora``: low-rank adapters (LoRA, through peft) on one sub-model."""

from __future__ import annotations

from pydantic import Field, field_validator

from .base import ConfigModel, InputPath, ModulePattern


class LoraConfig(ConfigModel):
    """LoRA on the sub-model this section sits in: ``W x + (alpha / rank) * B A x`` on every matched
    ``nn.Linear``; only ``A`` and ``B`` train, the base stays frozen (and may be kept in bf16 with the
    sub-model's ``dtype``). Checkpoints hold the adapters (and their optimizer state) only; the base
    reloads from ``from_pretrained`` / ``checkpoint_path`` on resume."""

    target_modules: list[ModulePattern] = []
    """Module path patterns *inside the sub-model* (``blocks.{*}.self_attn.q``), in the FSDP plan's
    syntax: ``{*}`` one integer segment, ``{a-b}`` a range, ``*`` any characters, ``?`` one character.
    Every pattern must match at least one ``nn.Linear``."""
    rank: int = Field(default=16, ge=1)
    """Rank r of each adapter (``A``: r x in_features, ``B``: out_features x r)."""
    alpha: float = Field(default=16.0, gt=0)
    """Scale numerator: the adapter's output is multiplied by ``alpha / rank``."""
    init_from: InputPath | None = None
    """A LoRA ``.safetensors`` file the adapters start from (instead of A random, B = 0): the PEFT /
    diffusers layout or a model's official one (``mm_checkpoint.read_lora_file``, through the sub-model's key
    map). Its layers must be exactly those ``target_modules`` match, at ``rank``; ``alpha`` may differ (the
    file's scale is kept). A resume restores the checkpoint's adapters instead. The run checks the file (it must
    exist; its header's layers and shapes) before it reads any weight."""
    dropout: float = 0.0
    """Dropout on the adapter's input. Only 0 is accepted: a dropout mask drawn inside the model would
    depend on the rank's sequence shard under Ulysses / Ring, not on the sample and step alone."""

    @field_validator("target_modules")
    @classmethod
    def _some_targets(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("expected at least one module pattern (e.g. `blocks.{*}.self_attn.q`)")
        return value

    @field_validator("dropout")
    @classmethod
    def _no_dropout(cls, value: float) -> float:
        if value != 0.0:
            raise ValueError(
                "expected 0: LoRA dropout is refused because its mask would be drawn per rank (context "
                "parallelism splits each sample's tokens over ranks), so a run would depend on its layout"
            )
        return value


__all__ = ["LoraConfig"]
