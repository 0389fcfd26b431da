"""``training.rewards``: the rewards a run scores its samples with, each by registered id, with a weight and
its options; and the options schemas of the built-in rewards (docs/DESIGN.md "Rewards").

A reward id is known to the config through its options schema (:func:`mm_config.register_reward_schema`):
an id without one is refused, naming the closest known id, before anything is built, and so are options
its schema does not accept (with their full path, ``training.rewards.0.options.target``). mm-trainer
builds the scorers (``mm_trainer.modes.rewards``) from the same ids.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, ValidationInfo, field_validator, model_validator

from .base import ConfigModel
from .errors import Problem, RuleViolations, suggest
from .registry import register_reward_schema, registered_ids, reward_schema, validate_plugin_dict


class RewardConfig(ConfigModel):
    """One reward (``training.rewards[i]``): a registered scorer, its weight in the combined reward and its
    options."""

    id: str = Field(min_length=1)
    """Registered reward id (built in: ``colour_target``; plugins register more)."""
    weight: float = 1.0
    """Factor of this reward in the combined reward (the weighted sum of the rewards); not 0."""
    options: dict[str, Any] = {}
    """The reward's own keys, validated by the schema its id registered."""

    @field_validator("options")
    @classmethod
    def _validate_options(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        return validate_plugin_dict(reward_schema(info.data.get("id")), value, info.context)

    @model_validator(mode="after")
    def _known_and_weighted(self) -> RewardConfig:
        problems = []
        if reward_schema(self.id) is None:
            known = registered_ids("reward")
            hint = suggest(self.id, known, what="reward id")
            problems.append(
                Problem(
                    ("id",),
                    f"unknown reward id; {hint} (a reward plugin registers its id with an options schema: "
                    "mm_config.register_reward_schema, from a module in training.plugin or an installed "
                    "mm_config.schemas entry point)",
                    self.id,
                )
            )
        if self.weight == 0:
            problems.append(Problem(("weight",), "must not be 0 (remove the reward instead)", self.weight))
        if problems:
            raise RuleViolations(problems)
        return self


def duplicate_reward_problems(rewards: list[RewardConfig]) -> list[Problem]:
    """A reward id listed twice (each reward's statistics are logged under its id)."""
    seen: set[str] = set()
    problems = []
    for i, reward in enumerate(rewards):
        if reward.id in seen:
            problems.append(Problem((i, "id"), "listed twice: each reward is logged under its id", reward.id))
        seen.add(reward.id)
    return problems


class ColourTargetOptions(ConfigModel):
    """``colour_target``: how close the mean colour of a clip's decoded frames is to ``target``: minus the
    Euclidean distance between the two RGB triples on a 0-1 scale (0 at the target, down to -sqrt(3))."""

    target: list[float] = Field(min_length=3, max_length=3)
    """The target colour, ``[r, g, b]`` each in [0, 1]."""

    @field_validator("target")
    @classmethod
    def _unit_range(cls, value: list[float]) -> list[float]:
        outside = [i for i, v in enumerate(value) if not 0.0 <= v <= 1.0]
        if outside:
            raise RuleViolations(
                [Problem((i,), "must lie in [0, 1] (RGB on a 0-1 scale)", value[i]) for i in outside]
            )
        return value


register_reward_schema("colour_target", ColourTargetOptions)

__all__ = [
    "ColourTargetOptions",
    "RewardConfig",
    "duplicate_reward_problems",
]
