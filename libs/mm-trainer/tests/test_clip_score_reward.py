"""The ``clip_score`` reward: a tiny transformers ``CLIPModel`` with a word-level tokenizer (``tokenizers``) and
a CLIP image processor, saved to a folder; the reward equals the cosine the model itself gives (its
``logits_per_text`` over its logit scale) on pixel values the upstream processor makes, averaged over frames."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

WORDS = ["<pad>", "<unk>", "<s>", "</s>", "a", "red", "blue", "ball", "square", "moving", "left"]


@pytest.fixture(scope="module")
def clip_folder(tmp_path_factory) -> Path:
    """A random tiny CLIPModel, its tokenizer (``<s> ... </s>``, pooled at ``</s>``) and processor settings."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import CLIPConfig, CLIPModel, PreTrainedTokenizerFast
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    folder = tmp_path_factory.mktemp("tiny_clip")
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 2), ("</s>", 3)]
    )
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                            unk_token="<unk>").save_pretrained(folder)  # fmt: skip
    text = dict(vocab_size=len(WORDS), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                num_attention_heads=2, max_position_embeddings=16, pad_token_id=0, bos_token_id=2, eos_token_id=3)  # fmt: skip
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=8,
                  patch_size=4)  # fmt: skip
    torch.manual_seed(0)
    CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=8)).save_pretrained(folder)
    CLIPImageProcessorPil(size={"shortest_edge": 8}, crop_size={"height": 8, "width": 8}).save_pretrained(
        folder
    )
    return folder


def test_clip_score_is_the_models_mean_cosine_of_prompt_and_chosen_frames(clip_folder):
    from mm_trainer import Rewards
    from transformers import AutoTokenizer, CLIPModel
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    prompts = ["a red ball moving left", "a blue square"]
    pixels = np.random.default_rng(0).integers(
        0, 256, size=(2, 3, 5, 8, 8), dtype=np.uint8
    )  # [B, 3, F, H, W]
    frames = torch.from_numpy(pixels).float() / 255 * 2 - 1
    entry = SimpleNamespace(
        id="clip_score", weight=1.0, options={"model_path": str(clip_folder), "frames": 3}
    )
    got = Rewards.from_config([entry]).score(prompts, frames=frames).each["clip_score"]

    chosen = [0, 2, 4]  # 3 of 5 frames, evenly spaced
    model = CLIPModel.from_pretrained(clip_folder).eval()
    images = [pixels[b, :, f].transpose(1, 2, 0) for b in range(2) for f in chosen]  # HWC uint8
    pixel_values = CLIPImageProcessorPil.from_pretrained(clip_folder)(images=images, return_tensors="pt")
    text = AutoTokenizer.from_pretrained(clip_folder)(prompts, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model(**text, pixel_values=pixel_values["pixel_values"])
    cosine = (out.logits_per_text / model.logit_scale.exp()).view(2, 2, 3)  # [prompt, clip, frame]
    expected = torch.stack([cosine[b, b].mean() for b in range(2)]).double()
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(expected[0], expected[1])


@pytest.mark.parametrize(("height", "width"), [(12, 16), (40, 24)])
def test_frames_of_another_size_are_resized_and_cropped_as_the_upstream_processor_does(
    clip_folder, height, width
):
    """Up to the processor's uint8 rounding after its PIL resize (a few 1/255 steps over std ~0.27)."""
    from mm_trainer.modes.clip_score import ImageTransform
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    pixels = np.random.default_rng(1).integers(0, 256, size=(2, height, width, 3), dtype=np.uint8)
    expected = CLIPImageProcessorPil.from_pretrained(clip_folder)(images=list(pixels), return_tensors="pt")
    got = ImageTransform.from_folder(clip_folder)(
        torch.from_numpy(pixels).permute(0, 3, 1, 2).float() / 127.5 - 1
    )
    assert got.shape == expected["pixel_values"].shape == (2, 3, 8, 8)
    torch.testing.assert_close(got, expected["pixel_values"], rtol=0, atol=0.05)


def test_the_planned_clip_score_holds_the_model_of_the_folders_config_on_meta(clip_folder):
    """``mm-train plan``'s build (``Rewards.from_config(planned=True)``): the model the run loads, on the meta
    device (no weight read; the planner materializes it as fake tensors)."""
    from mm_trainer import Rewards

    entry = SimpleNamespace(
        id="clip_score", weight=1.0, options={"model_path": str(clip_folder), "frames": 3}
    )
    (planned,), (real,) = (
        Rewards.from_config([entry], planned=True).modules(),
        Rewards.from_config([entry]).modules(),
    )
    assert all(p.is_meta for p in planned.parameters()) and not any(p.is_meta for p in real.parameters())
    assert [(n, p.shape, p.dtype) for n, p in planned.named_parameters()] == [
        (n, p.shape, p.dtype) for n, p in real.named_parameters()
    ]
