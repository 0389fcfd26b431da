"""UMT5 text encoder as a frozen sub-model, with its tokenizer (Wan's text side)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from mm_trainer import BaseModel, model_register
from transformers import AutoTokenizer, UMT5Config, UMT5EncoderModel


@model_register("umt5")
class UMT5TextEncoder(BaseModel, UMT5EncoderModel):
    """transformers ``UMT5EncoderModel`` (keys unchanged: ``shared``, ``encoder.block.N``...) + tokenizer.

    Built on meta and loaded after FSDP sharding by the default ``setup_weights`` (HF safetensors);
    ``post_load`` re-ties ``shared`` and ``encoder.embed_tokens``. ``tokenize`` pads to ``text_len``
    (Wan: 512); the pipeline zeroes embeddings beyond each prompt's length as Wan does.
    """

    text_len: int = 512

    @classmethod
    def build_from_config(cls, args: Any) -> UMT5TextEncoder:
        options = dict(args.config or {})
        text_len = options.pop("text_len", 512)
        tokenizer_path = options.pop("tokenizer", None) or args.from_pretrained
        source = Path(args.from_pretrained or "")
        if (source / "config.json").is_file():
            config = UMT5Config.from_pretrained(source, **options)
        else:  # structure from the YAML alone (e.g. --dry-run before the weights are downloaded)
            config = UMT5Config(**options)
        model = cls(config)
        model.text_len = text_len
        model._tokenizer_path = tokenizer_path
        return model

    @classmethod
    def from_pretrained(cls, args: Any) -> UMT5TextEncoder:  # type: ignore[override]
        model = cls.build_from_config(args)
        model.setup_weights(args)
        return model

    def post_load(self) -> None:
        self.encoder.embed_tokens = self.shared

    def random_init(self) -> None:
        raise RuntimeError(
            "the UMT5 text encoder has no weights source: set model.models.<text_encoder>.from_pretrained "
            "(a frozen text encoder is never trained from random weights)"
        )

    @property
    def tokenizer(self) -> Any:
        if getattr(self, "_tokenizer", None) is None:
            path = getattr(self, "_tokenizer_path", None)
            if path is None or not Path(path).exists():
                raise FileNotFoundError(f"UMT5 tokenizer not found at {path!r} (config key `tokenizer`)")
            self._tokenizer = AutoTokenizer.from_pretrained(path)
        return self._tokenizer

    def tokenize(self, prompts: list[str], device: torch.device | str) -> dict[str, torch.Tensor]:
        """``input_ids`` / ``attention_mask`` [B, text_len] for a list of prompts."""
        out = self.tokenizer(
            list(prompts),
            padding="max_length",
            truncation=True,
            max_length=self.text_len,
            add_special_tokens=True,
            return_tensors="pt",
        )
        return {"input_ids": out.input_ids.to(device), "attention_mask": out.attention_mask.to(device)}
