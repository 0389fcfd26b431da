"""UMT5 text encoder as a frozen sub-model, with its tokenizer (Wan's text side), from a transformers
folder, the official ``models_t5_umt5-xxl-enc-bf16.pth``, a ComfyUI ``umt5_xxl`` file, or a release root
(:mod:`wan22_train.release`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from mm_checkpoint import LoadReport
from mm_trainer import BaseModel, model_register
from transformers import AutoTokenizer, UMT5Config, UMT5EncoderModel

from wan22_train.release import UMT5_XXL, component_path, is_release_root, resolved_args


@model_register("umt5")
class UMT5TextEncoder(BaseModel, UMT5EncoderModel):
    """transformers ``UMT5EncoderModel`` (keys ``shared``, ``encoder.block.N``...) + tokenizer.

    Built on meta and loaded after FSDP sharding by ``setup_weights`` (transformers names as they are,
    the official ``.pth``'s through mm-checkpoint's ``umt5`` key map); ``post_load`` re-ties ``shared``
    and ``encoder.embed_tokens``. ``tokenize`` pads to ``text_len`` (Wan: 512); the pipeline zeroes
    embeddings beyond each prompt's length as Wan does.
    """

    weight_transform_model_type = "umt5"
    text_len: int = 512

    @classmethod
    def build_from_config(cls, args: Any) -> UMT5TextEncoder:
        options = dict(args.config or {})
        text_len = options.pop("text_len", 512)
        root = args.from_pretrained
        tokenizer_path = options.pop("tokenizer", None) or (
            component_path(root, "tokenizer") if root and is_release_root(root) else root
        )
        source = component_path(args.from_pretrained, "text_encoder")
        if source is not None and (source / "config.json").is_file():
            config = UMT5Config.from_pretrained(source, **options)
        elif source is not None and source.is_file():  # an official .pth or a ComfyUI file: UMT5-XXL
            config = UMT5Config(**(UMT5_XXL | options))
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

    def setup_weights(self, args: Any) -> LoadReport | None:
        """Load the encoder's weights from its source (found in a release root when it names one)."""
        return super().setup_weights(resolved_args(args, "text_encoder"))

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
