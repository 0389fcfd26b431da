"""The packed micro-batches a plan traces for ``data.packing`` (``token_budget``): the worst cases.

A packed run's micro-batch is one sequence of up to ``token_budget`` predictor tokens holding whole
samples of any of the data's shapes (``mm_data.TokenBalancedSampler``). The plan does not read the data,
so it plans the micro-batches that can cost the most memory for the shapes the config allows (the
container's ``packing_shapes(data)``: tokens per shape) within the budget, at most
:func:`samples_cap` samples each:

- ``largest``: the most tokens the budget can hold, in the fewest samples (largest shapes first). What
  grows with the tokens (every block's activations, the time embedding expanded per token) is largest
  here, and so is what grows faster than the tokens within a sample: attention whose kernel keeps
  per-sample buffers, a VAE's activations of the largest clip.
- ``smallest``: the most samples, filled up with larger shapes while tokens remain. What grows with the
  sample count (every sample's text: the text encoder's pass, cross-attention's keys and values in every
  block, per-sample encodes and losses) is largest here.

Neither bounds the other in general (text terms against per-token ones: which wins depends on the
text length, the width and the attention kernel), so the planner traces both and plans the larger
peak (:func:`mm_trainer.planner.trace.trace_run`); each shows as its own part of the report. One is
left out when it has no more samples, no more tokens and no larger sample than the other (with one
shape, or when the sample cap leaves both the same count): nothing in it can cost more. In
``benchmarks/plan_accuracy.py``'s packed run (a 768-wide predictor, 16-token texts) the ``largest`` one
is the peak (3.20 against 3.12 GiB: per-token activations outweigh what a sample adds); in a 64-wide
two-block predictor at 960 tokens, five samples against two, the ``smallest`` one was, and so can it
be with Wan's 512-token texts and small images.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any

Shape = Hashable


@dataclass(frozen=True)
class PackedMicroBatch:
    """One planned packed micro-batch: how many samples of each shape, and its tokens."""

    kind: str
    """``largest`` or ``smallest`` (module docstring)."""
    counts: tuple[tuple[Shape, int], ...]
    """``(shape, samples)`` pairs, largest shape first."""
    tokens: int
    budget: int

    @property
    def samples(self) -> int:
        return sum(n for _, n in self.counts)

    @property
    def largest_sample(self) -> Shape:
        return self.counts[0][0]

    def describe(self) -> str:
        """``"2 x 9x48x48 + 5 x 1x32x32: 1760 of 1808 tokens"`` (a tuple shape joined with ``x``)."""
        parts = " + ".join(f"{n} x {shape_name(shape)}" for shape, n in self.counts)
        return f"{parts}: {self.tokens} of {self.budget} tokens"


def shape_name(shape: Shape) -> str:
    """``(9, 48, 48)`` -> ``9x48x48``; any other shape key as ``str``."""
    return "x".join(map(str, shape)) if isinstance(shape, tuple) else str(shape)


def samples_cap(global_batch_size: int, dp_size: int, micro_batch_size: int) -> int:
    """The most samples one packed micro-batch can get: the step's ``global_batch_size`` samples fill
    ``dp_size x micro-steps`` micro-batches (``global_batch_size // (dp_size x micro_batch_size)``
    micro-steps, as the trainer's packed loader runs), each with at least one sample."""
    micro_steps = max(1, global_batch_size // (dp_size * micro_batch_size))
    return max(1, global_batch_size - dp_size * micro_steps + 1)


def worst_case_packs(tokens: Mapping[Shape, int], budget: int, cap: int) -> list[PackedMicroBatch]:
    """The ``largest`` and ``smallest`` packed micro-batches (module docstring) of ``tokens`` (tokens per
    shape) within ``budget`` tokens and ``cap`` samples; one when they are the same.

    Raises:
        ValueError: no shape, or a shape above the budget (the trainer refuses such a sample too).
    """
    if not tokens:
        raise ValueError("data.packing: the config gives no sample shape to plan")
    over = {shape_name(shape): n for shape, n in tokens.items() if n > budget}
    if over:
        raise ValueError(
            f"data.packing.token_budget={budget} is below these samples' tokens (shape: tokens): {over}; "
            "raise the budget"
        )
    shapes = sorted(tokens, key=lambda s: (-tokens[s], str(s)))
    largest = _fewest_samples_fill(shapes, tokens, budget, cap)
    smallest = _most_samples_fill(shapes, tokens, budget, cap)
    first, second = (
        _pack("largest", largest, shapes, tokens, budget),
        _pack("smallest", smallest, shapes, tokens, budget),
    )
    return [first] if _dominated(second, first, tokens) else [first, second]


def _dominated(pack: PackedMicroBatch, other: PackedMicroBatch, tokens: Mapping[Shape, int]) -> bool:
    """``pack`` has no more samples, tokens, nor a larger sample than ``other``: nothing in it can cost more."""
    return (
        pack.samples <= other.samples
        and pack.tokens <= other.tokens
        and tokens[pack.largest_sample] <= tokens[other.largest_sample]
    )


def _fewest_samples_fill(shapes: list[Shape], tokens: Mapping[Shape, int], budget: int, cap: int) -> dict:
    """The most tokens within ``budget`` in at most ``cap`` samples, in the fewest samples (exact: a
    knapsack over token sums, in units of the shapes' greatest common divisor)."""
    unit = math.gcd(*(tokens[s] for s in shapes))
    size = budget // unit
    fewest = [0] + [cap + 1] * size  # fewest samples reaching each sum (cap + 1: unreachable)
    last: list[Shape | None] = [None] * (size + 1)
    for total in range(1, size + 1):
        for shape in shapes:  # largest first: ties keep the larger shape
            step = tokens[shape] // unit
            if step <= total and fewest[total - step] + 1 < fewest[total]:
                fewest[total], last[total] = fewest[total - step] + 1, shape
    total = max(t for t in range(size + 1) if fewest[t] <= cap)
    counts: dict[Shape, int] = {}
    while total:
        shape = last[total]
        counts[shape] = counts.get(shape, 0) + 1
        total -= tokens[shape] // unit
    return counts


def _most_samples_fill(shapes: list[Shape], tokens: Mapping[Shape, int], budget: int, cap: int) -> dict:
    """As many samples of the smallest shape as the budget and ``cap`` allow, then each upgraded in
    turn to the largest shape the tokens left still fit."""
    smallest = shapes[-1]
    count = min(cap, budget // tokens[smallest])
    counts = {smallest: count}
    left = budget - count * tokens[smallest]
    for _ in range(count):
        bigger = next((s for s in shapes if 0 < tokens[s] - tokens[smallest] <= left), None)
        if bigger is None:
            break
        counts[smallest] -= 1
        counts[bigger] = counts.get(bigger, 0) + 1
        left -= tokens[bigger] - tokens[smallest]
    return {s: n for s, n in counts.items() if n}


def _pack(
    kind: str, counts: dict, shapes: list[Shape], tokens: Mapping[Shape, int], budget: int
) -> PackedMicroBatch:
    ordered = tuple((s, counts[s]) for s in shapes if counts.get(s))
    return PackedMicroBatch(kind, ordered, sum(tokens[s] * n for s, n in ordered), budget)


def planned_packs(container: Any, config: Any, dp_size: int) -> list[PackedMicroBatch]:
    """The packed micro-batches to trace for ``config`` (``data.packing``; none without it): the
    container's clip shapes and tokens (``packing_shapes(data)``) within the token budget.

    Raises:
        NotImplementedError: a container that does not describe its packed samples' shapes.
    """
    packing = getattr(config.data, "packing", None)
    if packing is None:
        return []
    shapes = getattr(container, "packing_shapes", None)
    if not callable(shapes):
        raise NotImplementedError(
            f"{type(container).__name__} does not describe the shapes of its packed samples: mm-train plan of "
            "a data.packing run needs packing_shapes(data) -> {shape: tokens} on the container and "
            'planning_batch(data, micro_batch_size, pack={shape: samples}) (docs/DESIGN.md "The model contract")'
        )
    training = config.training
    micro = training.micro_batch_size
    batch = training.global_batch_size or micro * dp_size * training.gradient_accumulation_steps
    return worst_case_packs(shapes(config.data), packing.token_budget, samples_cap(batch, dp_size, micro))


def part_prefix(pack: PackedMicroBatch, index: int) -> str:
    """The prefix of the traced parts of the ``index``-th planned pack: none for the first (the step's
    own micro-steps, timed), ``"<kind> samples: "`` for the others."""
    return "" if index == 0 else f"{pack.kind} samples: "
