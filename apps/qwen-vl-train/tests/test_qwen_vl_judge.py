"""The ``vlm_judge`` reward on the tiny Qwen2.5-VL folder: its score is P(positive) / (P(positive) + P(negative))
of the model's next token after the chat-template question about the clip, computed here by hand from the
same model's logits; a template without ``{prompt}`` is refused by ``mm-config check``."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

CONFIGS = Path(__file__).parents[1] / "configs"
TEMPLATE = "Is it {prompt}?"


def _judge(tiny_root, **options):
    import qwen_vl_train.plugin  # noqa: F401  (registers vlm_judge)
    from mm_trainer import Rewards

    options = {"model_path": str(tiny_root / "model"), "template": TEMPLATE, "positive": "blue", "negative": "A",
               "frames": 4, "fps": 8.0, **options}  # fmt: skip
    return Rewards.from_config([SimpleNamespace(id="vlm_judge", weight=1.0, options=options)])


def _by_hand(root: Path, clip_uint8: torch.Tensor, prompt: str) -> torch.Tensor:
    """P("blue") / (P("blue") + P("A")) after the Qwen chat text written out here, the clip's frames 0, 2, 3, 5
    (4 of 6, evenly spaced) as one video at 8 * 4 / 6 fps."""
    from mm_trainer import load_processor_parts
    from qwen_vl_train.mm_plugin import QwenVLPlugin
    from transformers import Qwen2_5_VLForConditionalGeneration

    tokenizer, image_processor = load_processor_parts(str(root / "model"))
    patches, grid = QwenVLPlugin(tokenizer, image_processor).video_patches(clip_uint8[[0, 2, 3, 5]].numpy())
    pads = "<|video_pad|>" * (int(grid.prod()) // 4)  # 2x2 merge
    text = (f"<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n<|vision_start|>{pads}"
            f"<|vision_end|>Is it {prompt}?<|im_end|>\n<|im_start|>assistant\n")  # fmt: skip
    ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(root / "model").eval()
    with torch.no_grad():
        logits = model(input_ids=ids, pixel_values_videos=patches, video_grid_thw=grid[None],
                       second_per_grid_ts=torch.tensor([2 / (8 * 4 / 6)])).logits[0, -1]  # fmt: skip
    p = logits.double().softmax(-1)
    blue, a = tokenizer.convert_tokens_to_ids("blue"), tokenizer.convert_tokens_to_ids("A")
    return p[blue] / (p[blue] + p[a])


def test_the_judges_score_is_the_models_probability_of_the_positive_answer_of_the_two(tiny_root):
    prompts = ["a white circle moving up", "a blue square"]
    clips = torch.randint(
        0, 256, (2, 6, 16, 16, 3), generator=torch.Generator().manual_seed(0), dtype=torch.uint8
    )
    frames = clips.permute(0, 4, 1, 2, 3).float() / 127.5 - 1  # [B, 3, F, H, W] in [-1, 1]
    got = _judge(tiny_root).score(prompts, frames=frames).each["vlm_judge"]
    expected = torch.stack([_by_hand(tiny_root, clips[b], prompts[b]) for b in range(2)])
    assert ((got > 0) & (got < 1)).all()
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6)
    assert not torch.allclose(got[0], got[1])


def test_an_answer_that_is_not_one_token_is_refused_naming_the_option(tiny_root):
    with pytest.raises(
        ValueError, match=r"positive 'Yes' is 3 tokens .* choose a word that is a single token"
    ):
        _judge(tiny_root, positive="Yes")


@pytest.mark.parametrize(
    ("template", "expected"),
    [("Does the clip match?", "must contain the placeholder {prompt}"),
     ("Is {prompt} a {prompt}?", "takes the placeholder {prompt} once and no other, found {prompt} twice"),
     ("Is {prompt} {style}?", "takes the placeholder {prompt} once and no other, found {style}")],
)  # fmt: skip
def test_mm_config_check_refuses_a_judge_template_without_the_prompt_placeholder(
    template, expected, tmp_path, capsys
):
    import yaml
    from mm_config.cli import main

    config = yaml.safe_load((CONFIGS / "tiny_sft.yaml").read_text())
    config["training"]["validation"] = {"prompts": ["a ball"]}
    config["training"]["rewards"] = [
        {"id": "vlm_judge", "options": {"model_path": "m", "template": template}}
    ]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    assert main(["check", str(tmp_path / "config.yaml"), "--no-path-check", "--world-size", "2"]) == 2
    assert f"training.rewards[0].options.template = {template!r}: {expected}" in capsys.readouterr().err
