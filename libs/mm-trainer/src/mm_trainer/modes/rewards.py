"""Rewards (``training.rewards``): scorers by registered id, pointwise (one score per sample), on a sample's
decoded frames or on its latents, combined as a weighted sum (docs/DESIGN.md "Rewards").

A reward is a class registered with ``@reward_register("<id>")`` (its options schema with
``mm_config.register_reward_schema``, so that ``mm-config check`` knows the id and its keys). It is built
with its options as keyword arguments, says what it scores (``inputs``: ``"frames"``, ``[B, 3, F, H, W]``
in [-1, 1] as the model samples them, or ``"latents"``, ``[B, C, T, h, w]``) and maps a batch of samples
and their prompts to one score per sample, ``[B]``.

:class:`Rewards` scores a batch with every configured reward and their weighted sum. A reward that raises,
returns another shape, or returns NaN / inf fails with a :class:`RewardError` naming the reward (its id and
place in ``training.rewards``) and the sample (its name, e.g. the validation prompt and seed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch

from mm_trainer.registry.registries import REWARD_REGISTRY, reward_register

RewardInput = Literal["frames", "latents"]
INPUTS: tuple[str, ...] = ("frames", "latents")


class Reward(Protocol):
    """What a registered reward is, once built from its options."""

    inputs: RewardInput
    """What it scores: decoded ``frames`` or ``latents``."""

    def __call__(self, samples: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        """One score per sample, ``[B]``, of ``samples`` (``[B, ...]``) and their ``prompts``."""
        ...


class RewardError(RuntimeError):
    """A reward failed on a sample, or scored it NaN / inf; the message names both."""


@reward_register("colour_target")
class ColourTarget:
    """How close the mean colour of a clip's frames is to ``target`` (RGB on a 0-1 scale): minus the
    Euclidean distance between the frames' mean RGB and ``target`` (0 at the target)."""

    inputs: RewardInput = "frames"

    def __init__(self, target: Sequence[float]) -> None:
        if len(target) != 3:
            raise ValueError(f"colour_target: target must be [r, g, b], got {list(target)}")
        self.target = torch.tensor([float(v) for v in target])

    def __call__(self, samples: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        mean = ((samples.float() + 1) / 2).clamp(0, 1).mean(dim=tuple(range(2, samples.ndim)))  # [B, 3]
        return -(mean - self.target.to(mean.device)).norm(dim=1)


@dataclass(frozen=True)
class RewardTerm:
    """One configured reward: its id, weight, place in ``training.rewards`` and the built scorer."""

    id: str
    weight: float
    index: int
    scorer: Reward

    @property
    def where(self) -> str:
        return f"reward {self.id!r} (training.rewards[{self.index}])"


@dataclass
class RewardScores:
    """A batch's scores: the weighted sum ``total`` ``[B]`` and each reward's own, by id."""

    total: torch.Tensor
    each: dict[str, torch.Tensor]


class Rewards:
    """The configured rewards, scoring batches of samples (:meth:`score`)."""

    def __init__(self, terms: Sequence[RewardTerm]) -> None:
        self.terms = list(terms)

    @classmethod
    def from_config(cls, rewards: Sequence[Any]) -> Rewards:
        """From ``training.rewards`` (``mm_config.RewardConfig`` entries: ``id``, ``weight``, ``options``)."""
        terms = []
        for index, entry in enumerate(rewards):
            factory = REWARD_REGISTRY.get(entry.id)
            try:
                scorer = factory(**dict(entry.options))
            except (TypeError, ValueError) as exc:
                raise ValueError(
                    f"training.rewards[{index}] ({entry.id!r}): bad options {entry.options}: {exc}"
                ) from exc
            if getattr(scorer, "inputs", None) not in INPUTS:
                raise TypeError(
                    f"training.rewards[{index}] ({entry.id!r}): a reward's `inputs` must be one of {list(INPUTS)}, "
                    f"got {getattr(scorer, 'inputs', None)!r}"
                )
            terms.append(RewardTerm(entry.id, float(entry.weight), index, scorer))
        return cls(terms)

    def __bool__(self) -> bool:
        return bool(self.terms)

    @property
    def ids(self) -> list[str]:
        return [t.id for t in self.terms]

    @property
    def needs(self) -> set[str]:
        """What the rewards score: a subset of ``{"frames", "latents"}``."""
        return {t.scorer.inputs for t in self.terms}

    def score(
        self,
        prompts: Sequence[str],
        *,
        frames: torch.Tensor | None = None,
        latents: torch.Tensor | None = None,
        names: Sequence[str] | None = None,
    ) -> RewardScores:
        """Every reward's scores of the batch (``frames`` and / or ``latents``, as the rewards need) and
        their weighted sum. ``names`` name the samples in errors (default ``sample <i>``)."""
        inputs = {"frames": frames, "latents": latents}
        size = len(prompts)
        names = list(names) if names is not None else [f"sample {i}" for i in range(size)]
        each: dict[str, torch.Tensor] = {}
        total = torch.zeros(size, dtype=torch.float64)
        for term in self.terms:
            samples = inputs[term.scorer.inputs]
            if samples is None:
                raise ValueError(f"{term.where} scores {term.scorer.inputs}, and none were given")
            scores = _scored(term, samples, prompts, names)
            each[term.id] = scores
            total += term.weight * scores
        return RewardScores(total, each)


def _scored(
    term: RewardTerm, samples: torch.Tensor, prompts: Sequence[str], names: Sequence[str]
) -> torch.Tensor:
    """``term``'s scores ``[B]`` (float64, on the CPU), or a :class:`RewardError` naming the sample."""
    size = len(prompts)
    try:
        scores = _as_scores(term, term.scorer(samples, list(prompts)), size)
    except RewardError:
        raise
    except Exception as exc:
        raise RewardError(
            f"{term.where} failed on {_failing(term, samples, prompts, names)}: {exc!r}"
        ) from exc
    bad = [names[i] for i in range(size) if not torch.isfinite(scores[i])]
    if bad:
        values = [float(scores[i]) for i in range(size) if not torch.isfinite(scores[i])]
        raise RewardError(f"{term.where} scored {', '.join(bad)} non-finite: {values}")
    return scores


def _as_scores(term: RewardTerm, scores: Any, size: int) -> torch.Tensor:
    scores = torch.as_tensor(scores)
    if scores.shape != (size,):
        raise RewardError(
            f"{term.where} returned a score of shape {tuple(scores.shape)}: expected one per sample, ({size},)"
        )
    return scores.detach().to("cpu", torch.float64)


def _failing(term: RewardTerm, samples: torch.Tensor, prompts: Sequence[str], names: Sequence[str]) -> str:
    """The first sample on which ``term`` raises alone, or the whole batch when none does."""
    for i in range(len(prompts)):
        try:
            term.scorer(samples[i : i + 1], [prompts[i]])
        except Exception:  # noqa: BLE001 - looking for the sample that makes it raise
            return f"{names[i]} (prompt {prompts[i]!r})"
    return f"the batch of {', '.join(names)} (no sample alone)"


__all__ = [
    "ColourTarget",
    "Reward",
    "RewardError",
    "RewardScores",
    "RewardTerm",
    "Rewards",
    "reward_register",
]
