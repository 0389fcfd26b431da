"""The host copy an asynchronous checkpoint save stages (``training.async_save``), as a plan's host line.

A background save copies this rank's checkpointed state into host memory before training goes on
(``mm_checkpoint.background_save``): the local shards of the trainable parameters, AdamW's two fp32
moments and fp32 step counter of each, and the fp32 EMA where ``training.ema`` is on. Frozen parameters (a frozen
sub-model, a LoRA base) are not checkpointed, so not staged. The copy is kept for the next save.
"""

from __future__ import annotations

from typing import Any

from mm_trainer.planner.categories import register_host_term

FP32 = 4
ADAMW_MOMENTS = 2


def staging_bytes(run: Any) -> int:
    """Bytes one rank stages for a background save of the traced run (configured layout)."""
    total = 0
    for shard in run.shards:
        if not shard.trainable:
            continue
        numel = shard.local_numel(shard.traced_shard)
        total += numel * shard.itemsize + numel * FP32 * ADAMW_MOMENTS + FP32  # + the step counter
        if run.config.training.ema is not None:
            total += numel * FP32
    return total


@register_host_term
def async_save_staging(run: Any) -> tuple[str, int, str] | None:
    """The plan's host line for ``training.async_save`` (None when saves are synchronous)."""
    if not run.config.training.async_save:
        return None
    return (
        "async checkpoint staging",
        staging_bytes(run),
        "training.async_save: trainable shards + AdamW + EMA",
    )
