"""The ``vlm_judge`` reward: a Qwen2.5-VL model (the one this app trains) asked whether a clip shows its prompt.

For each clip: ``frames`` evenly spaced frames go in as one video, through the image processor and the
``qwen2_vl`` multimodal plugin exactly as training's videos do (``video_patches``: pixel values, grid and
``second_per_grid_ts`` at the rate the frames were taken, ``fps * frames / F``); the question is
``template`` with the clip's prompt in place of ``{prompt}``, after the video in one user turn of the
tokenizer's chat template, with the generation prompt (the assistant turn opened). The score reads the
next-token logits there::

    score = P(positive) / (P(positive) + P(negative)) = sigmoid(logit[positive] - logit[negative])

in (0, 1), for the single tokens ``positive`` / ``negative`` (default ``Yes`` / ``No``). Why logits and not
a generated number: one forward, no sampling and no decoding, so the score is deterministic, continuous
(it separates two clips the model would both answer ``Yes`` to) and never fails to parse.

The model is loaded from a local folder (never a hub download), frozen and in eval mode, and moved to
the run's device; the frames are processed on the CPU by the upstream image processor. One forward per
clip (the prompts' lengths differ; no padding to get wrong in the 3-D rotary positions).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from mm_config import check_template
from mm_data import ChatTemplate, VideoClip
from mm_trainer import evenly_spaced_frames, import_transformers, load_processor_parts, reward_register

from qwen_vl_train.config_schema import JUDGE_TEMPLATE
from qwen_vl_train.mm_plugin import QwenVLPlugin


def answer_token(tokenizer: object, word: str, key: str) -> int:
    """The id of ``word`` as one token (``key`` names the option in the error)."""
    ids = tokenizer.encode(word, add_special_tokens=False)  # type: ignore[attr-defined]
    if len(ids) != 1:
        raise ValueError(
            f"vlm_judge: {key} {word!r} is {len(ids)} tokens {ids} of the model's tokenizer; the score reads "
            "one token's probability: choose a word that is a single token"
        )
    return int(ids[0])


@reward_register("vlm_judge")
class VLMJudge:
    """``vlm_judge``: P(``positive``) / (P(``positive``) + P(``negative``)) of a Qwen2.5-VL model's answer to
    ``template`` (with the prompt) about the clip.

    Args:
        model_path: a local Qwen2.5-VL folder (weights, tokenizer with its chat template, image processor).
        template: the question; ``{prompt}`` is replaced by the clip's prompt (and nothing else).
        positive, negative: the answers compared, each one token.
        frames: frames of the clip shown, evenly spaced.
        fps: the clip's frame rate (the time between the shown frames follows from it).
    """

    inputs = "frames"

    def __init__(self, model_path: str, template: str = JUDGE_TEMPLATE, positive: str = "Yes",
                 negative: str = "No", frames: int = 4, fps: float = 16.0) -> None:  # fmt: skip
        check_template(template, "prompt")
        transformers = import_transformers("the vlm_judge reward")
        if not (Path(model_path) / "config.json").is_file():
            raise ValueError(f"model_path {model_path}: no config.json; expected a local Qwen2.5-VL folder")
        tokenizer, image_processor = load_processor_parts(model_path)
        self.plugin = QwenVLPlugin(tokenizer, image_processor)
        self.chat = ChatTemplate(tokenizer)
        self.answers = (
            answer_token(tokenizer, positive, "positive"),
            answer_token(tokenizer, negative, "negative"),
        )
        model = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(model_path)
        self.model = model.requires_grad_(False).eval()
        self.template, self.frames, self.fps = template, frames, fps

    def to(self, device: torch.device | str) -> VLMJudge:
        """The model on ``device`` (the run's)."""
        self.model.to(device)
        return self

    def inputs_of(self, clip: torch.Tensor, prompt: str) -> dict[str, torch.Tensor]:
        """The model inputs asking about ``clip`` (``[3, F, H, W]`` in [-1, 1]) and ``prompt``."""
        picked = evenly_spaced_frames(clip.shape[1], self.frames)
        pixels = ((clip[:, picked].float() + 1) * 127.5).round().clamp(0, 255).to(torch.uint8)
        video = VideoClip(np.ascontiguousarray(pixels.permute(1, 2, 3, 0).cpu().numpy()),
                          self.fps * len(picked) / clip.shape[1])  # fmt: skip
        features = self.plugin.process([], [video])
        question = self.template.format(prompt=prompt)
        text = self.chat.render([{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": question}]}],
                                add_generation_prompt=True)  # fmt: skip
        ids = self.plugin.tokenizer(text, add_special_tokens=False)["input_ids"]
        ids, _ = self.plugin.expand(list(ids), list(ids), features)
        return {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long),
                **features.tensors}  # fmt: skip

    @torch.no_grad()
    def __call__(self, samples: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        device = next(self.model.parameters()).device
        scores = []
        for clip, prompt in zip(samples, prompts, strict=True):
            batch = {k: v.to(device) for k, v in self.inputs_of(clip, prompt).items()}
            logits = self.model(**batch).logits[0, -1].float()  # the first answer token
            scores.append(torch.sigmoid(logits[self.answers[0]] - logits[self.answers[1]]))
        return torch.stack(scores)


__all__ = ["VLMJudge", "answer_token"]
