"""The Qwen-VL YAML keys, checked by ``mm-config check`` before anything is built.

Imports only pydantic and mm-config (no torch), so it is installed as the ``mm_config.schemas`` entry point
``qwen_vl`` and runs on a login node: the ``config`` of the model id ``qwen2_5_vl`` is the generic
transformers-model schema (``mm_config.HFModelConfig``; its ``hf_config`` keys and ``freeze_groups`` are
checked against the model class by mm-trainer's model checks), and the multimodal plugin ``qwen2_vl``
is declared, so the check knows every name the plugin registers. The reward ``vlm_judge`` has its
options schema here (:class:`VLMJudgeOptions`).
"""

from __future__ import annotations

from mm_config import (
    ConfigModel,
    HFModelConfig,
    check_template,
    declare_ids,
    model_folder,
    register_model_schema,
    register_reward_schema,
)
from pydantic import Field, field_validator, model_validator

JUDGE_TEMPLATE = 'Does this video show "{prompt}"? Answer Yes or No.'


class VLMJudgeOptions(ConfigModel):
    """``vlm_judge`` (``training.rewards``): a Qwen2.5-VL model asked ``template`` about a clip; the score is
    P(``positive``) / (P(``positive``) + P(``negative``)) of its next token, in (0, 1)."""

    model_path: model_folder("qwen2_5_vl", files=("preprocessor_config.json",))  # type: ignore[valid-type]
    """A local Qwen2.5-VL folder: weights, tokenizer with its chat template, ``preprocessor_config.json``;
    loaded frozen, in eval mode, on the run's device."""
    template: str = JUDGE_TEMPLATE
    """The question asked after the clip; ``{prompt}`` (required, once) is replaced by the clip's prompt
    (``{{`` / ``}}`` for literal braces)."""
    positive: str = Field(default="Yes", min_length=1)
    """The answer that scores 1 (one token of the model's tokenizer, checked when the reward is built)."""
    negative: str = Field(default="No", min_length=1)
    """The answer that scores 0 (one token, likewise)."""
    frames: int = Field(default=4, ge=1)
    """Frames of the clip shown to the model, evenly spaced (a multiple of 2, the temporal patch, is
    filled by repeating the last)."""
    fps: float = Field(default=16.0, gt=0)
    """The clip's frame rate (``training.validation.fps``): sets the time between the frames shown."""

    @field_validator("template")
    @classmethod
    def _one_prompt_placeholder(cls, value: str) -> str:
        return check_template(value, "prompt")

    @model_validator(mode="after")
    def _two_answers(self) -> VLMJudgeOptions:
        if self.positive == self.negative:
            raise ValueError(f"positive and negative must differ, both are {self.positive!r}")
        return self


register_model_schema("qwen2_5_vl", HFModelConfig)
declare_ids("mm_plugin", "qwen2_vl")
register_reward_schema("vlm_judge", VLMJudgeOptions)
