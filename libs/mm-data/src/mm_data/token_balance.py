"""Token-balanced packing: the samples of a global step assigned to dp ranks and micro-steps by tokens.

A packed run puts several samples of different shapes into one sequence per micro-batch, so what a
micro-batch costs is its token count, not its sample count. The plan of one global step:

1. **The global step's samples** are a function of (seed, epoch, data, global batch size) only:
   the epoch's permutation (``numpy.random.default_rng([seed, epoch])``) cut into chunks of
   ``global_batch_size`` samples, whatever their shapes (no buckets: packing takes any mix). So the
   set of samples a step trains is the same at any dp size, token budget or accumulation.
2. **The number of micro-steps** ``k`` is the smallest with which the step's samples fit ``dp x k``
   micro-batches of at most ``token_budget`` tokens each, starting from
   ``ceil(step tokens / (dp x budget))``; a fixed ``micro_steps`` may be asked for instead.
3. **The assignment** is longest-processing-time first: the step's samples, largest first (ties by
   their place in the step), each to the micro-batch with the fewest tokens among those it fits
   (ties by micro-batch number), over all ``dp x k`` micro-batches at once. Micro-batch ``b`` is
   micro-step ``b // dp`` of dp rank ``b % dp``. Balancing all micro-batches together balances
   every micro-step across ranks (FSDP's collectives wait for the slowest rank at every micro-step)
   and so every rank's step total.

Every rank computes the whole plan from the same numbers, so no rank's identity enters the order; a
rank then takes its own micro-batches. A sample above the budget is refused when the sampler is
built (naming the sample and its tokens), before any work.
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch.utils.data import Sampler

__all__ = [
    "StepPlan",
    "TokenBalancedSampler",
    "TokenBudgetError",
    "check_token_budget",
    "patch_tokens",
    "plan_step",
    "token_imbalance",
]


class TokenBudgetError(ValueError):
    """A sample (or a step's samples) cannot fit the token budget of a micro-batch."""


@dataclass(frozen=True)
class StepPlan:
    """One global step's micro-batches: ``micro[m][r]`` lists the dataset indices that dp rank ``r``
    packs at micro-step ``m``, in their order in the global step (so packing order is layout-free)."""

    micro: tuple[tuple[tuple[int, ...], ...], ...]

    @property
    def micro_steps(self) -> int:
        """Micro-steps (gradient-accumulation steps) of this global step on every rank."""
        return len(self.micro)

    @property
    def dp_size(self) -> int:
        return len(self.micro[0])

    def rank(self, dp_rank: int) -> list[list[int]]:
        """Dp rank ``dp_rank``'s micro-batches, in micro-step order."""
        return [list(ranks[dp_rank]) for ranks in self.micro]

    def samples(self) -> set[int]:
        """Every dataset index the step trains."""
        return {i for ranks in self.micro for batch in ranks for i in batch}

    def rank_tokens(self, tokens: Sequence[int]) -> list[int]:
        """Tokens each dp rank processes in the whole step."""
        return [sum(tokens[i] for ranks in self.micro for i in ranks[r]) for r in range(self.dp_size)]


def patch_tokens(latent_frames: int, latent_height: int, latent_width: int, patch=(1, 2, 2)) -> int:
    """Tokens of a latent of ``frames x height x width`` cut into ``patch`` (frames, height, width) patches."""
    pt, ph, pw = patch
    return -(-latent_frames // pt) * -(-latent_height // ph) * -(-latent_width // pw)


def token_imbalance(loads: Sequence[int]) -> float:
    """``max / mean - 1`` of per-rank token counts: the fraction of the step the slowest rank adds."""
    mean = sum(loads) / len(loads)
    return max(loads) / mean - 1.0 if mean else 0.0


def check_token_budget(
    tokens: Sequence[int], token_budget: int, *, names: Sequence[str] | None = None, key: str = "token_budget"
) -> None:
    """Raise :class:`TokenBudgetError` naming every sample whose tokens exceed ``token_budget``: its
    index, its name (``names[i]``, e.g. its file, when given) and its tokens; ``key`` names the budget."""
    if not isinstance(token_budget, int) or isinstance(token_budget, bool) or token_budget < 1:
        raise TokenBudgetError(f"{key} must be a positive int, got {token_budget!r}")
    over = [(i, int(n)) for i, n in enumerate(tokens) if n > token_budget]
    if over:
        listed = ", ".join(
            f"sample {i}{f' ({names[i]})' if names is not None else ''}: {n} tokens" for i, n in over[:10]
        )
        more = f" (and {len(over) - 10} more)" if len(over) > 10 else ""
        raise TokenBudgetError(
            f"{key}={token_budget} is below the largest sample: {listed}{more}; "
            f"raise the budget to at least {max(n for _, n in over)} or drop these samples"
        )


def _assign(order: list[tuple[int, int]], bins: int, budget: int) -> list[list[int]] | None:
    """LPT of ``(tokens, place)`` items into ``bins`` bins of ``budget``; None when one does not fit.

    Each item goes to the least-loaded bin (ties: the lowest bin number); if it does not fit there it
    fits nowhere.
    """
    loads = [(0, b) for b in range(bins)]  # a heap of (tokens, bin)
    members: list[list[int]] = [[] for _ in range(bins)]
    for n, place in order:
        load, b = heapq.heappop(loads)
        if load + n > budget:
            return None
        members[b].append(place)
        heapq.heappush(loads, (load + n, b))
    return members


def plan_step(
    step_samples: Sequence[int],
    tokens: Sequence[int],
    *,
    dp_size: int,
    token_budget: int,
    micro_steps: int | None = None,
) -> StepPlan:
    """The token-balanced plan of one global step (see the module docstring).

    Args:
        step_samples: The step's dataset indices in their global order.
        tokens: Token count of every dataset index.
        dp_size: Data-parallel ranks.
        token_budget: Most tokens in one micro-batch (one packed sequence).
        micro_steps: A fixed number of micro-steps; default the fewest that fit.

    Raises:
        TokenBudgetError: a sample exceeds the budget, the step cannot give every micro-batch a
            sample (fewer samples than ``dp x micro-steps``), or the samples do not fit ``micro_steps``.
    """
    if dp_size < 1:
        raise ValueError(f"dp_size must be >= 1, got {dp_size}")
    step_tokens = [int(tokens[i]) for i in step_samples]
    check_token_budget(step_tokens, token_budget)
    order = sorted(((n, place) for place, n in enumerate(step_tokens)), key=lambda t: (-t[0], t[1]))
    k = micro_steps or max(1, -(-sum(step_tokens) // (dp_size * token_budget)))
    while True:
        if dp_size * k > len(step_samples):
            raise TokenBudgetError(
                f"a global step of {len(step_samples)} samples ({sum(step_tokens)} tokens; first samples "
                f"{list(step_samples)[:8]}) cannot give each of {dp_size} ranks x {k} micro-steps of at most "
                f"{token_budget} tokens a sample; raise the token budget or the global batch size"
            )
        members = _assign(order, dp_size * k, token_budget)
        if members is not None:
            break
        if micro_steps is not None:
            raise TokenBudgetError(
                f"a global step of {len(step_samples)} samples ({sum(step_tokens)} tokens; first samples "
                f"{list(step_samples)[:8]}) does not fit {dp_size} ranks x micro_steps={k} of at most "
                f"{token_budget} tokens; raise the token budget or micro_steps"
            )
        k += 1
    batches = [tuple(step_samples[p] for p in sorted(m)) for m in members]
    return StepPlan(tuple(tuple(batches[m * dp_size : (m + 1) * dp_size]) for m in range(k)))


class TokenBalancedSampler(Sampler[list[int]]):
    """Yields this dp rank's packed micro-batches (lists of dataset indices) in the global order.

    Global step ``s`` of an epoch trains samples ``order[s*G : (s+1)*G]`` of the epoch's permutation,
    at any layout; :func:`plan_step` splits them over dp ranks and micro-steps by tokens. The number
    of micro-steps may differ from step to step (read it with :meth:`micro_steps_at`) unless
    ``micro_steps`` fixes it; it is the same on every rank of a step.

    Args:
        tokens: Token count of every dataset sample (what its packed sequence holds).
        global_batch_size: Samples per global (optimizer) step over all ranks.
        dp_rank, dp_size: This rank's data-parallel rank and the dp size (CP ranks pass their dp rank).
        token_budget: Most tokens per micro-batch.
        seed: Seed of the per-epoch permutation.
        micro_steps: Fix the micro-steps per global step (else the fewest that fit each step).
        shuffle: Permute each epoch (else dataset order).
        drop_last: Drop the epoch's incomplete last global step (else keep it, smaller).

    Raises:
        TokenBudgetError: at construction, a sample above ``token_budget`` (named with its tokens).
    """

    def __init__(
        self,
        tokens: Sequence[int],
        *,
        global_batch_size: int,
        dp_rank: int,
        dp_size: int,
        token_budget: int,
        seed: int = 0,
        micro_steps: int | None = None,
        shuffle: bool = True,
        drop_last: bool = True,
    ) -> None:
        self.tokens = [int(n) for n in tokens]
        check_token_budget(self.tokens, token_budget)
        if dp_size < 1 or not 0 <= dp_rank < dp_size:
            raise ValueError(f"need 0 <= dp_rank < dp_size, got dp_rank={dp_rank}, dp_size={dp_size}")
        if global_batch_size < dp_size:
            raise ValueError(
                f"global_batch_size={global_batch_size} must be at least dp_size={dp_size} (a sample per rank)"
            )
        if micro_steps is not None and micro_steps < 1:
            raise ValueError(f"micro_steps must be >= 1, got {micro_steps}")
        self.num_samples = len(self.tokens)
        self.global_batch_size, self.dp_rank, self.dp_size = global_batch_size, dp_rank, dp_size
        self.token_budget, self.seed, self.micro_steps = token_budget, seed, micro_steps
        self.shuffle, self.drop_last = shuffle, drop_last
        self.epoch, self.step, self.micro_offset = 0, 0, 0
        self._orders: dict[str, Any] = {}
        self._plans: dict[tuple[int, int], StepPlan] = {}

    @functools.cached_property
    def steps_per_epoch(self) -> int:
        g = self.global_batch_size
        return self.num_samples // g if self.drop_last else -(-self.num_samples // g)

    def epoch_order(self, epoch: int) -> list[int]:
        """The epoch's permutation of dataset indices (the same on every rank and layout)."""
        if not self.shuffle:
            return list(range(self.num_samples))
        return np.random.default_rng([self.seed, epoch]).permutation(self.num_samples).tolist()

    def step_samples(self, epoch: int, step: int) -> list[int]:
        """Dataset indices of global step ``step`` of ``epoch``, in global order."""
        g = self.global_batch_size
        return self._order(epoch)[step * g : (step + 1) * g]

    def _order(self, epoch: int) -> list[int]:
        if self._orders.get("epoch") != epoch:
            self._orders = {"epoch": epoch, "order": self.epoch_order(epoch)}
        return self._orders["order"]

    def plan(self, epoch: int, step: int) -> StepPlan:
        """The token-balanced plan of global step ``step`` of ``epoch``."""
        if (epoch, step) not in self._plans:
            if len(self._plans) > 64:
                self._plans.clear()
            self._plans[epoch, step] = plan_step(
                self.step_samples(epoch, step),
                self.tokens,
                dp_size=self.dp_size,
                token_budget=self.token_budget,
                micro_steps=self.micro_steps,
            )
        return self._plans[epoch, step]

    def check_epoch(self, epoch: int) -> None:
        """Plan every global step of ``epoch`` now (host arithmetic): a step that cannot fit the budget
        (with a fixed ``micro_steps``, or too few samples for its micro-batches) is refused before work.

        Raises:
            TokenBudgetError: naming the step and epoch.
        """
        for step in range(self.steps_per_epoch):
            try:
                plan_step(
                    self.step_samples(epoch, step),
                    self.tokens,
                    dp_size=self.dp_size,
                    token_budget=self.token_budget,
                    micro_steps=self.micro_steps,
                )
            except TokenBudgetError as error:
                raise TokenBudgetError(f"global step {step} of epoch {epoch}: {error}") from None

    def micro_steps_at(self, epoch: int, step: int) -> int:
        """Micro-steps of global step ``step`` of ``epoch`` (the same on every rank)."""
        return self.plan(epoch, step).micro_steps

    def __len__(self) -> int:
        """Micro-batches this rank yields in the current epoch."""
        return sum(self.micro_steps_at(self.epoch, s) for s in range(self.steps_per_epoch))

    def __iter__(self):
        while self.step < self.steps_per_epoch:
            mine = self.plan(self.epoch, self.step).rank(self.dp_rank)
            batch = mine[self.micro_offset]
            self.micro_offset += 1
            if self.micro_offset == len(mine):
                self.step, self.micro_offset = self.step + 1, 0
            yield batch
        self.epoch, self.step, self.micro_offset = self.epoch + 1, 0, 0

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning; a no-op when it is already the current epoch."""
        if epoch != self.epoch:
            self.epoch, self.step, self.micro_offset = int(epoch), 0, 0

    # ------------------------------------------------ positions (ResumableDataLoader's interface)
    def _locate(self, epoch: int, position: int) -> tuple[int, int]:
        """(global step, micro-step) of this rank's micro-batch number ``position`` of ``epoch``."""
        if self.micro_steps is not None:
            return divmod(position, self.micro_steps)
        step = 0
        while step < self.steps_per_epoch and position >= (k := self.micro_steps_at(epoch, step)):
            position, step = position - k, step + 1
        return step, position

    def _position_of(self, epoch: int, step: int, micro: int) -> int:
        return sum(self.micro_steps_at(epoch, s) for s in range(step)) + micro

    def position(self) -> int:
        """Micro-batches of the current epoch this rank has handed out."""
        return self._position_of(self.epoch, self.step, self.micro_offset)

    def state_at(self, epoch: int, position: int) -> dict[str, Any]:
        """The state after handing out ``position`` micro-batches of ``epoch``."""
        step, micro = self._locate(epoch, position)
        return {**self.state_dict(), "epoch": epoch, "step": step, "micro_offset": micro}

    def sample_ids_at(self, epoch: int, position: int) -> list[int]:
        """Global sample ids of this rank's micro-batch number ``position`` of ``epoch`` (:meth:`sample_ids`)."""
        return self.sample_ids(epoch, *self._locate(epoch, position))

    def dataset_index(self, sample_id: int) -> int:
        """The dataset index of global sample ``sample_id`` (:meth:`sample_ids`)."""
        per_epoch = self.steps_per_epoch * self.global_batch_size
        epoch, place = divmod(sample_id, per_epoch)
        step, slot = divmod(place, self.global_batch_size)
        return self.step_samples(epoch, step)[slot]

    def sample_ids(self, epoch: int, step: int, micro: int) -> list[int]:
        """Global sample ids (place in the run's global order) of this rank's micro-batch ``micro`` of
        a step: the same numbers for the same sample at any dp size, budget or accumulation."""
        samples = self.step_samples(epoch, step)
        place = {index: p for p, index in enumerate(samples)}
        base = (epoch * self.steps_per_epoch + step) * self.global_batch_size
        return [base + place[i] for i in self.plan(epoch, step).rank(self.dp_rank)[micro]]

    def state_dict(self) -> dict[str, Any]:
        """Epoch, global step and micro-step reached (plus what makes a resume checkable)."""
        return {
            "epoch": self.epoch,
            "step": self.step,
            "micro_offset": self.micro_offset,
            "global_batch_size": self.global_batch_size,
            "dp_size": self.dp_size,
            "token_budget": self.token_budget,
            "seed": self.seed,
            "num_samples": self.num_samples,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at the next unseen global step; dp size and budget may differ at a step boundary.

        Raises:
            ValueError: another seed, dataset or global batch size, or a mid-step state at another dp
                size or token budget.
        """
        for key in ("seed", "num_samples", "global_batch_size"):
            if state.get(key) != getattr(self, key):
                raise ValueError(
                    f"sampler state has {key}={state.get(key)} but this sampler has {getattr(self, key)}; "
                    "the global order would differ"
                )
        offset = state.get("micro_offset", 0)
        if offset and (state.get("dp_size"), state.get("token_budget")) != (self.dp_size, self.token_budget):
            raise ValueError(
                f"sampler state stops {offset} micro-batches into a step (dp_size={state.get('dp_size')}, "
                f"token_budget={state.get('token_budget')}); resume at a step boundary to change layout"
            )
        if not 0 <= int(state["step"]) <= self.steps_per_epoch:
            raise ValueError(
                f"sampler state has step={state['step']}; an epoch has {self.steps_per_epoch} steps"
            )
        self.epoch, self.step, self.micro_offset = int(state["epoch"]), int(state["step"]), int(offset)
