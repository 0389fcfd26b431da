"""``training.rewards``: the rewards a run scores its samples with, each by registered id, with a weight and
its options; and the options schemas of the built-in rewards (docs/DESIGN.md "Rewards").

A reward id is known to the config through its options schema (:func:`mm_config.register_reward_schema`):
an id without one is refused, naming the closest known id, before anything is built, and so are options
its schema does not accept (with their full path, ``training.rewards.0.options.target``). mm-trainer
builds the scorers (``mm_trainer.modes.rewards``) from the same ids.
"""

from __future__ import annotations

import json
import string
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, ValidationInfo, field_validator, model_validator

from .base import ConfigModel, InputPath
from .errors import Problem, RuleViolations, suggest
from .registry import register_reward_schema, registered_ids, reward_schema, validate_plugin_dict


class RewardConfig(ConfigModel):
    """One reward (``training.rewards[i]``): a registered scorer, its weight in the combined reward and its
    options."""

    id: str = Field(min_length=1)
    """Registered reward id (built in: ``colour_target``, ``clip_score``, ``distinctness``, ``tone_target``; the
    qwen-vl-train plugin: ``vlm_judge``; plugins register more)."""
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


class ToneTargetOptions(ConfigModel):
    """``tone_target``: how close the dominant frequency of a clip's decoded audio is to ``frequency``: minus
    the distance in octaves, ``-|log2(f_dominant / frequency)|`` (0 at the target). Scores the audio: a
    reward fine-tuning of a pipeline that rolls out audio (LTX-2 with ``model.pipeline.audio``) only."""

    frequency: float = Field(gt=0)
    """The target tone, in Hz."""


def model_folder(*model_types: str, files: tuple[str, ...] = ()) -> Any:
    """A ``model_path`` option: a transformers folder the reward loads (never a hub id). With the
    ``check_paths`` context (``mm-config check``, a run's load) it must exist, hold a ``config.json``
    whose ``model_type`` is one of ``model_types``, and hold ``files``."""
    return Annotated[InputPath, AfterValidator(_folder_check(model_types, files))]


def _folder_check(
    model_types: tuple[str, ...], files: tuple[str, ...]
) -> Callable[[str, ValidationInfo], str]:
    def check(value: str, info: ValidationInfo) -> str:
        if not (isinstance(info.context, dict) and info.context.get("check_paths")):
            return value
        folder = Path(value)
        if not (folder / "config.json").is_file():
            raise ValueError(
                "expected a local transformers model folder (with config.json); none found there"
            )
        try:
            model_type = json.loads((folder / "config.json").read_text()).get("model_type")
        except (OSError, ValueError, AttributeError) as exc:
            raise ValueError(f"its config.json cannot be read: {exc}") from None
        if model_type not in model_types:
            raise ValueError(
                f"its config.json has model_type {model_type!r}; expected one of {list(model_types)}"
            )
        missing = [name for name in files if not (folder / name).is_file()]
        if missing:
            raise ValueError(
                f"missing {', '.join(missing)} (the reward needs the model's {', '.join(files)})"
            )
        return value

    return check


def check_template(template: str, placeholder: str) -> str:
    """``template`` if it is a ``str.format`` template holding ``{placeholder}`` once and no other field
    (``{{`` / ``}}`` are literal braces); else a ``ValueError`` saying what is expected."""
    try:
        fields = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as exc:
        raise ValueError(f"not a format template ({exc}); write {{{{ and }}}} for literal braces") from None
    if placeholder not in fields:
        raise ValueError(f"must contain the placeholder {{{placeholder}}}")
    if fields != [placeholder]:
        others = ", ".join(f"{{{f}}}" for f in fields if f != placeholder) or f"{{{placeholder}}} twice"
        raise ValueError(f"takes the placeholder {{{placeholder}}} once and no other, found {others}")
    return template


class ClipScoreOptions(ConfigModel):
    """``clip_score``: how well a clip's frames match its prompt by a CLIP model: the cosine similarity of
    the prompt's text embedding and each scored frame's image embedding, averaged over the frames (in
    [-1, 1]; a plain cosine, without CLIP's logit scale)."""

    model_path: model_folder("clip", files=("preprocessor_config.json",))  # type: ignore[valid-type]
    """A local folder holding a transformers ``CLIPModel`` (``config.json`` + weights), its tokenizer and
    ``preprocessor_config.json`` (resize, crop, mean and std); loaded frozen, in eval mode, on the run's device."""
    frames: int | None = Field(default=None, ge=1)
    """Frames scored per clip, evenly spaced from the first to the last; None (default): every frame."""
    batch_size: int = Field(default=64, ge=1)
    """Frames per forward of the image tower."""


class DistinctnessOptions(ConfigModel):
    """``distinctness`` (groupwise): how far each clip of a group (clips of one prompt) lies from the group's
    mean clip: the root-mean-square difference of their frames (0 for a group of identical clips)."""

    inputs: Literal["frames", "latents"] = "frames"
    """What it compares: decoded ``frames`` or ``latents``."""


register_reward_schema("colour_target", ColourTargetOptions)
register_reward_schema("clip_score", ClipScoreOptions)
register_reward_schema("distinctness", DistinctnessOptions)
register_reward_schema("tone_target", ToneTargetOptions)

__all__ = [
    "ClipScoreOptions",
    "ColourTargetOptions",
    "DistinctnessOptions",
    "ToneTargetOptions",
    "model_folder",
    "check_template",
    "RewardConfig",
    "duplicate_reward_problems",
]
