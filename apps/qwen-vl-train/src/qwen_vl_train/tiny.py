"""``qwen-vl-train make-tiny``: a random tiny Qwen2.5-VL folder, built locally, plus a ShareGPT dataset.

The folder has what a real Qwen2.5-VL folder has: ``config.json`` + ``model.safetensors``
(``save_pretrained``), a fast tokenizer (byte-level BPE trained here with ``tokenizers`` on the
dataset's text) carrying a Jinja chat template in the Qwen2-VL format (``assets/``), and the image
processor's ``preprocessor_config.json``. The data are PNG images and short mp4 clips of coloured
shapes (``mm_data.make_synthetic_dataset``) with questions about them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from mm_data import make_synthetic_dataset

ASSETS = Path(__file__).parent / "assets"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                  "<|image_pad|>", "<|video_pad|>"]  # fmt: skip

#: the image processor of the tiny model: 4-pixel patches, 2x2 merge, 2 frames per temporal patch
IMAGE_PROCESSOR = {"patch_size": 4, "merge_size": 2, "temporal_patch_size": 2, "min_pixels": 8 * 8,
                   "max_pixels": 64 * 64}  # fmt: skip

VISION = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "in_channels": 3,
          "patch_size": 4, "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 16,
          "fullatt_block_indexes": [1], "tokens_per_second": 2, "out_hidden_size": 32}  # fmt: skip
TEXT = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 1024, "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]}}  # fmt: skip

QUESTIONS = ["What is in the picture?", "Describe the image.", "Which shape do you see?"]


def conversation_rows(metadata: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """ShareGPT rows: one question per image or clip, answered with its caption; a two-turn one too."""
    rows = []
    for i, item in enumerate(metadata):
        caption = item["cap"][0]
        if item["kind"] == "image":
            turns = [("human", f"<image>{QUESTIONS[i % len(QUESTIONS)]}"), ("gpt", caption)]
            media = {"images": [item["path"]]}
        else:
            turns = [("human", "<video>What happens in the video?"), ("gpt", caption),
                     ("human", "And the colour?"), ("gpt", caption.split()[1])]  # fmt: skip
            media = {"videos": [item["path"]]}
        rows.append(
            {"id": f"sample-{i}", "conversations": [{"from": r, "value": v} for r, v in turns], **media}
        )
    return rows


def write_tokenizer(out: Path, corpus: list[str]) -> Any:
    """A byte-level BPE ``PreTrainedTokenizerFast`` trained on ``corpus`` with the Qwen special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=(ASSETS / "qwen2_vl_chat_template.jinja").read_text(),
    )
    fast.save_pretrained(out)
    return fast


def write_model(out: Path, tokenizer: Any, seed: int) -> Any:
    """A random ``Qwen2_5_VLForConditionalGeneration`` (weights drawn from ``seed``) saved to ``out``."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in (
        ("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>"))}  # fmt: skip
    text = {**TEXT, "vocab_size": len(tokenizer), "bos_token_id": tokenizer.pad_token_id,
            "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}  # fmt: skip
    config = Qwen2_5_VLConfig(text_config=text, vision_config=VISION, tie_word_embeddings=False, **ids)
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(config)
    model.save_pretrained(out)
    return model


def make_tiny(out_dir: str | Path, *, seed: int = 0, num_images: int = 6, num_clips: int = 2) -> Path:
    """Write ``model/`` (weights, tokenizer, processor) and ``data/`` (media + ``sharegpt.json``)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    out = Path(out_dir)
    meta_path = make_synthetic_dataset(
        out / "data", num_clips=num_clips, sizes=((32, 32), (32, 48)), fps=8, num_frames=17,
        num_images=num_images, seed=seed,
    )  # fmt: skip
    rows = conversation_rows(json.loads(meta_path.read_text()))
    (out / "data" / "sharegpt.json").write_text(json.dumps(rows, indent=1))
    corpus = [
        t["value"].replace("<image>", "").replace("<video>", "") for r in rows for t in r["conversations"]
    ]
    corpus += ["system\nYou are a helpful assistant.", "user\n", "assistant\n"]
    model_dir = out / "model"
    tokenizer = write_tokenizer(model_dir, corpus)
    Qwen2VLImageProcessorPil(**IMAGE_PROCESSOR).save_pretrained(model_dir)
    write_model(model_dir, tokenizer, seed)
    return out
