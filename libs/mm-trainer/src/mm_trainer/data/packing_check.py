"""A packed run's check that every sample fits its token budget (``data.packing.token_budget``), before
any model is materialized or any weight read.

What a sample costs in a packed sequence is its token count, which the model container says
(``packing_tokens(dataset)``: from the sample's shape, the VAE's compression and the predictor's patch).
Those need the sub-models' configs, not their weights, so the check builds the container on the meta
device (as the planner and the plan-pattern check do) and the dataset (its metadata: each sample's shape),
and refuses a sample above the budget with a :class:`mm_data.TokenBudgetError` naming its index, its file
and its tokens, and the budget. The batch stream checks the same again when it builds its sampler.
"""

from __future__ import annotations

from typing import Any

from mm_data import check_token_budget

from mm_trainer.data.batches import build_dataset
from mm_trainer.model.container import ModelContainerHub

__all__ = ["check_packing_budget", "sample_names"]

BUDGET_KEY = "data.packing.token_budget"


def sample_names(dataset: Any) -> list[str] | None:
    """Each sample's file (the ``path`` of its metadata row), or None when the dataset does not list them."""
    rows = getattr(dataset, "rows", None)
    if rows is None or len(rows) != len(dataset):
        return None
    return [str(row.get("path", "?")) if isinstance(row, dict) else "?" for row in rows]


def check_packing_budget(config: Any) -> None:
    """Refuse a packed run (``data.packing``) whose data holds a sample above the token budget; nothing
    to check without packing, or when the container does not count tokens (the batch stream refuses it).

    Raises:
        mm_data.TokenBudgetError: naming every sample over the budget (index, file, tokens) and the budget.
    """
    packing = getattr(config.data, "packing", None)
    if packing is None:
        return
    trainable = config.training.trainable_submodels or config.model.trainable_submodels()
    container = ModelContainerHub.build(config.model, device="cpu", trainable=trainable, meta_init=True)
    count = getattr(container, "packing_tokens", None)
    if count is None:
        return
    dataset = build_dataset(config.data)
    check_token_budget(count(dataset), packing.token_budget, names=sample_names(dataset), key=BUDGET_KEY)
