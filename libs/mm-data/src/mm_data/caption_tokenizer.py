"""A word-level tokenizer over the synthetic captions' words, for tiny text encoders in tests and demos.

Needs the optional ``tokenizers`` and ``transformers`` packages (``pip install 'mm-data[tokenizer]'``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .synthetic import caption_vocabulary


def write_caption_tokenizer(
    out: str | Path,
    *,
    special_tokens: Mapping[str, str],
    template: str,
    model_max_length: int = 512,
    padding_side: str = "right",
) -> Any:
    """Save (and return) a ``PreTrainedTokenizerFast`` whose vocabulary is ``special_tokens`` then
    every word of :func:`caption_vocabulary`, lower-cased and split on whitespace/punctuation.

    Args:
        special_tokens: role -> token, e.g. ``{"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>"}``
            (``unk_token`` is required; ids follow this order, so ``<pad>`` first gets id 0).
        template: single-sequence template of ``tokenizers`` (``"$A </s>"`` for T5, ``"<bos> $A"``).
    """
    try:
        from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
        from transformers import PreTrainedTokenizerFast
    except ImportError as err:
        raise ImportError(
            f"write_caption_tokenizer needs tokenizers and transformers: pip install 'mm-data[tokenizer]' ({err})"
        ) from err

    if "unk_token" not in special_tokens:
        raise ValueError("special_tokens needs an unk_token (words outside the captions map to it)")
    vocab = {w: i for i, w in enumerate([*special_tokens.values(), *caption_vocabulary()])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=special_tokens["unk_token"]))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    in_template = [t for t in special_tokens.values() if t in template.split()]
    tok.post_processor = processors.TemplateProcessing(
        single=template, special_tokens=[(t, vocab[t]) for t in in_template]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, model_max_length=model_max_length, padding_side=padding_side, **special_tokens
    )
    fast.save_pretrained(out)
    return fast
