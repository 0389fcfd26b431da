"""A run's check of its samples against the model, before any model is materialized or any weight read:
every sample fits the token budget of a packed run (``data.packing.token_budget``), and the pipeline can
train every sample's frame count (an image, a one-frame sample, where the task needs several frames).

Both need the sub-models' configs, not their weights (a sample's tokens: its shape, the VAE's compression
and the predictor's patch), so the check builds the container on the meta device (as the planner and the
plan-pattern check do) and the dataset (its metadata: each sample's shape), and asks the container:

- ``packing_tokens(dataset)``: each sample's tokens (a container without it, or one that cannot count this
  run's samples, is refused with a :class:`PackingError`: exit 2); one above the budget is refused with a
  :class:`mm_data.TokenBudgetError` naming its index, its file and its tokens, and the budget (the batch
  stream checks the same again when it builds its sampler);
- ``sample_frame_problems(dataset)``: ``{index: why}`` of the samples the pipeline cannot train for their
  frame count (asked only when the container class's ``checks_sample_frames(model_section)`` says it may
  refuse some), refused with a :class:`SampleFramesError` naming each sample's index and file.

A run that neither packs nor has such a pipeline builds nothing here.
"""

from __future__ import annotations

from typing import Any

from mm_data import check_token_budget

from mm_trainer.data.batches import build_dataset
from mm_trainer.model.build import build_meta_container
from mm_trainer.model.container import container_class

__all__ = ["PackingError", "SampleFramesError", "check_samples", "sample_names"]

BUDGET_KEY = "data.packing.token_budget"


class SampleFramesError(ValueError):
    """Samples whose frame count the run's pipeline cannot train (an image in a task that needs frames)."""

    raised_on_every_rank = True  # every rank checks the same data: rank 0 alone prints it


class PackingError(ValueError):
    """``data.packing`` in a run that cannot pack: its model container counts no tokens (no ``packing_tokens``,
    e.g. LTX-2), or cannot count this run's (a task it does not pack, samples whose shapes are unknown)."""

    raised_on_every_rank = True  # every rank checks the same config: rank 0 alone prints it


def sample_names(dataset: Any) -> list[str] | None:
    """Each sample's file (the ``path`` of its metadata row), or None when the dataset does not list them."""
    rows = getattr(dataset, "rows", None)
    if rows is None or len(rows) != len(dataset) or not all(isinstance(row, dict) for row in rows):
        return None  # e.g. an encoder cache's rows: the index alone names the sample
    return [str(row.get("path", "?")) for row in rows]


def _checks_frames(config: Any) -> bool:
    hook = getattr(container_class(config.model), "checks_sample_frames", None)
    return bool(hook(config.model)) if callable(hook) else False


def check_samples(config: Any) -> None:
    """Refuse a run whose data holds a sample above ``data.packing.token_budget`` or one its pipeline cannot
    train for its frame count (see the module docstring); nothing is built when there is nothing to check.

    Raises:
        mm_data.TokenBudgetError: naming every sample over the budget (index, file, tokens) and the budget.
        SampleFramesError: naming every sample of a frame count the pipeline refuses (index, file, why).
    """
    packing = getattr(config.data, "packing", None)
    frames = _checks_frames(config)
    if packing is None and not frames:
        return
    container = build_meta_container(config)
    dataset = build_dataset(config.data)
    names = sample_names(dataset)
    if frames:
        where = dataset.describe() if callable(getattr(dataset, "describe", None)) else config.data.data_path
        _refuse_frames(container.sample_frame_problems(dataset), names, where)
    if packing is not None:
        check_token_budget(
            _packing_tokens(container, dataset), packing.token_budget, names=names, key=BUDGET_KEY
        )


def _packing_tokens(container: Any, dataset: Any) -> list[int]:
    count = getattr(container, "packing_tokens", None)
    if count is None:
        raise PackingError(
            f"data.packing: the model container {type(container).__name__} does not train packed micro-batches "
            "(it counts no tokens per sample: no packing_tokens); remove data.packing"
        )
    try:
        return list(count(dataset))
    except ValueError as e:  # the container's reason (a task it does not pack, shapes it cannot read)
        raise PackingError(str(e)) from e


def _refuse_frames(problems: dict[int, str], names: list[str] | None, data_path: Any) -> None:
    if not problems:
        return
    lines = [f"{data_path}: {len(problems)} sample(s) of a frame count the pipeline cannot train:"]
    lines += [
        f"  sample {i}{f' ({names[i]})' if names is not None else ''}: {why}"
        for i, why in sorted(problems.items())
    ]
    raise SampleFramesError("\n".join(lines))
