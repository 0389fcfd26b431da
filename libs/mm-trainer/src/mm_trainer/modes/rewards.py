"""Rewards (``training.rewards``): scorers by registered id, pointwise (one score per sample) or groupwise
(one score per sample of a group of samples of one prompt, scored together), on a sample's decoded frames
or on its latents, combined as a weighted sum (docs/DESIGN.md "Rewards").

A reward is a class registered with ``@reward_register("<id>")`` (its options schema with
``mm_config.register_reward_schema``, so that ``mm-config check`` knows the id and its keys). It is built
with its options as keyword arguments, says what it scores (``inputs``: ``"frames"``, ``[B, 3, F, H, W]``
in [-1, 1] as the model samples them, ``"latents"``, ``[B, C, T, h, w]``, or ``"audio"``, waveforms
``[B, channels, samples]``, called with the keyword ``sample_rate`` too) and maps a batch of samples
and their prompts to one score per sample, ``[B]``. A reward with ``groupwise = True`` is called once per
group (the samples the caller marked with one group id, all of one prompt) and may score each sample
relative to the others (:class:`Distinctness`). A reward with a model has ``to(device)``, called once
when it is built for a run.

:class:`Rewards` scores a batch with every configured reward and their weighted sum. A reward that raises,
or returns NaN / inf, fails with a :class:`RewardError` naming the reward (its id and place in
``training.rewards``) and the sample (its name, e.g. the validation prompt and seed): with
``training.reward_failure: stop`` (default) it is raised, with ``skip`` the sample is dropped from the
batch's statistics (:attr:`RewardScores.kept`) and the error is logged. A reward that returns another
shape is a bug of the reward and always raised.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

import torch

from mm_trainer.modes import clip_score  # noqa: F401  (registers clip_score)
from mm_trainer.registry.registries import REWARD_REGISTRY, reward_register

logger = logging.getLogger("mm_trainer")

RewardInput = Literal["frames", "latents", "audio"]
INPUTS: tuple[str, ...] = ("frames", "latents", "audio")
FAILURE_POLICIES: tuple[str, ...] = ("stop", "skip")


class Reward(Protocol):
    """What a registered reward is, once built from its options."""

    inputs: RewardInput
    """What it scores: decoded ``frames`` or ``latents``."""

    def __call__(self, samples: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        """One score per sample, ``[B]``, of ``samples`` (``[B, ...]``) and their ``prompts`` (a groupwise
        reward: one group, all of one prompt)."""
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


@reward_register("tone_target")
class ToneTarget:
    """How close the dominant frequency of a clip's audio is to ``frequency`` (Hz): minus the distance in
    octaves, ``-|log2(f / frequency)|`` (0 at the target), ``f`` the strongest non-zero bin of the
    magnitude spectrum of the channels' mean (a resolution of ``sample_rate / samples`` Hz)."""

    inputs: RewardInput = "audio"

    def __init__(self, frequency: float) -> None:
        if not frequency > 0:
            raise ValueError(f"tone_target: frequency must be > 0 Hz, got {frequency}")
        self.frequency = float(frequency)

    def __call__(self, samples: torch.Tensor, prompts: Sequence[str], *, sample_rate: int) -> torch.Tensor:
        mono = samples.float().mean(dim=1)  # [B, S]
        spectrum = torch.fft.rfft(mono, dim=-1).abs()
        spectrum[:, 0] = 0  # the mean (DC) is no tone
        bins = torch.fft.rfftfreq(mono.shape[-1], d=1.0 / sample_rate).to(mono.device)
        dominant = bins[spectrum.argmax(dim=-1)].clamp_min(float(bins[1]))
        return -(dominant / self.frequency).log2().abs()


@reward_register("distinctness")
class Distinctness:
    """Groupwise: how far each sample of a group lies from the group's mean sample, the root-mean-square
    of ``sample - mean(group)`` over its elements (0 for a group of identical samples, or of one). Rewards
    variety among the clips of one prompt; a demo of a groupwise reward."""

    groupwise = True

    def __init__(self, inputs: RewardInput = "frames") -> None:
        self.inputs = inputs

    def __call__(self, samples: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        x = samples.double().flatten(1)  # [G, elements]
        return (x - x.mean(dim=0, keepdim=True)).pow(2).mean(dim=1).sqrt()


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

    @property
    def groupwise(self) -> bool:
        return bool(getattr(self.scorer, "groupwise", False))


@dataclass
class RewardScores:
    """A batch's scores: the weighted sum ``total`` ``[B]`` and each reward's own, by id (float64, CPU).

    ``kept`` ``[B]`` (bool) marks the samples every reward scored; with ``reward_failure: skip`` the others
    were dropped (their ``total`` is NaN, the failing reward's score too) and ``skipped`` holds one line
    per failure (the reward, the sample, the error). Statistics are taken over ``kept``."""

    total: torch.Tensor
    each: dict[str, torch.Tensor]
    kept: torch.Tensor
    skipped: list[str] = field(default_factory=list)


class Rewards:
    """The configured rewards, scoring batches of samples (:meth:`score`).

    Args:
        terms: the rewards.
        on_failure: ``"stop"`` raises a :class:`RewardError` for a sample a reward fails on (raises, or
            scores NaN / inf); ``"skip"`` drops the sample from the batch's statistics and logs why.
    """

    def __init__(self, terms: Sequence[RewardTerm], *, on_failure: str = "stop") -> None:
        if on_failure not in FAILURE_POLICIES:
            raise ValueError(
                f"training.reward_failure: expected one of {list(FAILURE_POLICIES)}, got {on_failure!r}"
            )
        self.terms = list(terms)
        self.on_failure = on_failure

    @classmethod
    def from_config(
        cls,
        rewards: Sequence[Any],
        *,
        on_failure: str = "stop",
        device: torch.device | None = None,
        planned: bool = False,
    ) -> Rewards:
        """From ``training.rewards`` (``mm_config.RewardConfig`` entries: ``id``, ``weight``, ``options``)
        and ``training.reward_failure``; a reward with a model is moved to ``device`` (the run's).

        ``planned`` (``mm-train plan``): a reward with a model (a ``to`` method) is built by its classmethod
        ``planned(**options)``, its model on the meta device (nothing read; the planner materializes
        :meth:`modules` as fake tensors); one without ``planned`` is refused."""
        terms = []
        for index, entry in enumerate(rewards):
            factory = REWARD_REGISTRY.get(entry.id)
            if planned and callable(getattr(factory, "to", None)) and not hasattr(factory, "planned"):
                raise ValueError(
                    f"training.rewards[{index}] ({entry.id!r}) holds a model and has no `planned(**options)` "
                    "classmethod that builds it on the meta device: the planner cannot plan it without reading "
                    "its weights"
                )
            build = factory.planned if planned and hasattr(factory, "planned") else factory
            try:
                scorer = build(**dict(entry.options))
            except (TypeError, ValueError) as exc:
                raise ValueError(
                    f"training.rewards[{index}] ({entry.id!r}): bad options {entry.options}: {exc}"
                ) from exc
            if getattr(scorer, "inputs", None) not in INPUTS:
                raise TypeError(
                    f"training.rewards[{index}] ({entry.id!r}): a reward's `inputs` must be one of {list(INPUTS)}, "
                    f"got {getattr(scorer, 'inputs', None)!r}"
                )
            move = getattr(scorer, "to", None)
            if device is not None and callable(move):
                move(device)
            terms.append(RewardTerm(entry.id, float(entry.weight), index, scorer))
        return cls(terms, on_failure=on_failure)

    def __bool__(self) -> bool:
        return bool(self.terms)

    @property
    def ids(self) -> list[str]:
        return [t.id for t in self.terms]

    @property
    def needs(self) -> set[str]:
        """What the rewards score: a subset of ``{"frames", "latents"}``."""
        return {t.scorer.inputs for t in self.terms}

    @property
    def needs_frames(self) -> bool:
        """Whether a reward scores decoded frames: the samples go through the VAE first."""
        return "frames" in self.needs

    @property
    def needs_audio(self) -> bool:
        """Whether a reward scores decoded audio (waveforms): the samples' audio is decoded first."""
        return "audio" in self.needs

    def modules(self) -> list[torch.nn.Module]:
        """The torch modules the rewards hold (their models), each once."""
        found: dict[int, torch.nn.Module] = {}
        for term in self.terms:
            for value in vars(term.scorer).values():
                if isinstance(value, torch.nn.Module):
                    found.setdefault(id(value), value)
        return list(found.values())

    @property
    def groupwise(self) -> list[str]:
        """The ids of the groupwise rewards (they need group ids: :meth:`score`)."""
        return [t.id for t in self.terms if t.groupwise]

    def score(
        self,
        prompts: Sequence[str],
        *,
        frames: torch.Tensor | None = None,
        latents: torch.Tensor | None = None,
        names: Sequence[str] | None = None,
        groups: Sequence[int] | None = None,
        audio: torch.Tensor | None = None,
        sample_rate: int | None = None,
    ) -> RewardScores:
        """Every reward's scores of the batch (``frames``, ``latents`` and / or ``audio`` waveforms at
        ``sample_rate``, as the rewards need) and their weighted sum. ``names`` name the samples in errors (default ``sample <i>``). ``groups``: a
        group id per sample, the samples of one id all of one prompt; a groupwise reward scores each group
        on its own (needed when there is a groupwise reward)."""
        inputs = {"frames": frames, "latents": latents, "audio": audio}
        size = len(prompts)
        names = list(names) if names is not None else [f"sample {i}" for i in range(size)]
        chunks = _groups(prompts, groups, names) if groups is not None else None
        each: dict[str, torch.Tensor] = {}
        skipped: list[str] = []
        total = torch.zeros(size, dtype=torch.float64)
        for term in self.terms:
            samples = inputs[term.scorer.inputs]
            if samples is None:
                raise ValueError(f"{term.where} scores {term.scorer.inputs}, and none were given")
            if term.scorer.inputs == "audio":
                term = replace(term, scorer=_AtRate(term.scorer, sample_rate))
            if term.groupwise and chunks is None:
                raise ValueError(
                    f"{term.where} is groupwise (it scores the samples of one prompt together), and no group "
                    "ids were given"
                )
            scores = torch.full((size,), torch.nan, dtype=torch.float64)
            for chunk in chunks if term.groupwise else [list(range(size))]:
                part, failures = self._chunk(term, samples, prompts, names, chunk)
                scores[chunk] = part
                skipped += failures
            each[term.id] = scores
            total += term.weight * scores
        kept = (
            torch.stack([v.isfinite() for v in each.values()]).all(0)
            if each
            else torch.ones(size, dtype=torch.bool)
        )
        if skipped:
            logger.warning("rewards: skipped %d sample(s) (training.reward_failure: skip): %s", int((~kept).sum()),
                           "; ".join(skipped))  # fmt: skip
        return RewardScores(total, each, kept, skipped)

    def _chunk(
        self,
        term: RewardTerm,
        samples: torch.Tensor,
        prompts: Sequence[str],
        names: list[str],
        chunk: list[int],
    ) -> tuple[torch.Tensor, list[str]]:
        """``term``'s scores of the samples ``chunk`` (the batch, or one group for a groupwise reward) and,
        with ``skip``, a line per sample it failed on (NaN there); with ``stop`` a failure raises."""
        sub = samples if len(chunk) == len(prompts) else samples[torch.tensor(chunk)]
        texts, labels = [prompts[i] for i in chunk], [names[i] for i in chunk]
        try:
            scores = _scored(term, sub, texts, labels)
        except _Raised as raised:
            if self.on_failure == "stop":
                raise RewardError(str(raised)) from raised.__cause__
            if term.groupwise or len(chunk) == 1:  # a group's scores depend on every sample of it
                return torch.full((len(chunk),), torch.nan, dtype=torch.float64), [str(raised)]
            return _one_by_one(term, sub, texts, labels)
        return _finite(term, scores, labels, stop=self.on_failure == "stop")


class _AtRate:
    """An audio reward called with the waveforms' ``sample_rate`` (its other attributes its own)."""

    def __init__(self, scorer: Reward, sample_rate: int | None) -> None:
        if sample_rate is None:
            raise ValueError("rewards on audio need the waveforms' sample_rate")
        self.scorer, self.sample_rate = scorer, int(sample_rate)

    def __getattr__(self, name: str) -> Any:
        if name == "scorer":  # not set yet
            raise AttributeError(name)
        return getattr(self.scorer, name)

    def __call__(self, samples: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        return self.scorer(samples, prompts, sample_rate=self.sample_rate)  # type: ignore[call-arg]


class _Raised(Exception):
    """A reward raised on a chunk of samples (the message names the reward and the sample)."""


def _groups(prompts: Sequence[str], groups: Sequence[int], names: Sequence[str]) -> list[list[int]]:
    """The sample indices of each group id, in order of first appearance; a group of two prompts is refused."""
    if len(groups) != len(prompts):
        raise ValueError(
            f"rewards: {len(groups)} group ids for {len(prompts)} samples; expected one per sample"
        )
    out: dict[int, list[int]] = {}
    for i, g in enumerate(groups):
        out.setdefault(int(g), []).append(i)
    for g, members in out.items():
        if len({prompts[i] for i in members}) > 1:
            raise ValueError(
                f"rewards: group {g} ({', '.join(names[i] for i in members)}) holds several prompts; a group is "
                "the samples of one prompt"
            )
    return list(out.values())


def _scored(
    term: RewardTerm, samples: torch.Tensor, prompts: Sequence[str], names: Sequence[str]
) -> torch.Tensor:
    """``term``'s scores ``[B]`` (float64, on the CPU); :class:`_Raised` naming the sample where the reward
    raises; a :class:`RewardError` for a score of another shape."""
    try:
        out = term.scorer(samples, list(prompts))
    except Exception as exc:
        raise _Raised(f"{term.where} failed on {_failing(term, samples, prompts, names)}: {exc!r}") from exc
    return _as_scores(term, out, len(prompts))


def _finite(
    term: RewardTerm, scores: torch.Tensor, names: Sequence[str], *, stop: bool
) -> tuple[torch.Tensor, list[str]]:
    """``scores`` with a line per NaN / inf one (``stop``: a :class:`RewardError` naming them instead)."""
    bad = [i for i in range(len(scores)) if not torch.isfinite(scores[i])]
    if bad and stop:
        values = [float(scores[i]) for i in bad]
        raise RewardError(f"{term.where} scored {', '.join(names[i] for i in bad)} non-finite: {values}")
    lines = [f"{term.where} scored {names[i]} non-finite: {float(scores[i])}" for i in bad]
    scores[bad] = torch.nan  # inf too: left out like NaN
    return scores, lines


def _one_by_one(
    term: RewardTerm, samples: torch.Tensor, prompts: list[str], names: list[str]
) -> tuple[torch.Tensor, list[str]]:
    """A pointwise reward's scores sample by sample (after the batch raised): NaN and a line for each sample
    it fails on alone."""
    scores = torch.full((len(prompts),), torch.nan, dtype=torch.float64)
    failures = []
    for i in range(len(prompts)):
        try:
            one = _scored(term, samples[i : i + 1], prompts[i : i + 1], names[i : i + 1])
        except _Raised as raised:
            failures.append(str(raised))
            continue
        scores[i : i + 1], lines = _finite(term, one, names[i : i + 1], stop=False)
        failures += lines
    return scores, failures


def _as_scores(term: RewardTerm, scores: Any, size: int) -> torch.Tensor:
    scores = torch.as_tensor(scores)
    if scores.shape != (size,):
        raise RewardError(
            f"{term.where} returned a score of shape {tuple(scores.shape)}: expected one per sample, ({size},)"
        )
    return scores.detach().to("cpu", torch.float64)


def _failing(term: RewardTerm, samples: torch.Tensor, prompts: Sequence[str], names: Sequence[str]) -> str:
    """The first sample on which ``term`` raises alone, or the whole batch when none does (a groupwise
    reward: the group)."""
    if term.groupwise:
        return f"the group of {', '.join(names)} (prompt {prompts[0]!r})"
    for i in range(len(prompts)):
        try:
            term.scorer(samples[i : i + 1], [prompts[i]])
        except Exception:  # noqa: BLE001 - looking for the sample that makes it raise
            return f"{names[i]} (prompt {prompts[i]!r})"
    return f"the batch of {', '.join(names)} (no sample alone)"


__all__ = [
    "ColourTarget",
    "Distinctness",
    "Reward",
    "RewardError",
    "RewardScores",
    "RewardTerm",
    "Rewards",
    "ToneTarget",
    "reward_register",
]
