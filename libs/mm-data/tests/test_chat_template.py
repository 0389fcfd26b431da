"""Chat templates render conversations; labels cover exactly the assistant tokens."""

from __future__ import annotations

import pytest
from mm_data import IGNORE_INDEX, TEMPLATES, ChatTemplate, register_template

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

WORDS = ["<pad>", "<unk>", "<|im_start|>", "<|im_end|>", "system", "user", "assistant", "hi", "red", "square",
         "and", "blue", "circle", "what"]  # fmt: skip


def word_tokenizer(chat_template: str | None = None):
    """Whitespace word tokenizer: one token per word or special marker, offsets from the text."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", chat_template=chat_template
    )
    fast.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    return fast


MESSAGES = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "red square"},
    {"role": "user", "content": "what"},
    {"role": "assistant", "content": "blue circle"},
]


def test_labels_are_the_assistant_tokens_at_known_positions():
    tok = word_tokenizer()
    encoded = ChatTemplate(tok, "chatml").encode(MESSAGES)
    words = [WORDS[i] for i in encoded.input_ids]
    assert words == ["<|im_start|>", "user", "hi", "<|im_end|>",
                     "<|im_start|>", "assistant", "red", "square", "<|im_end|>",
                     "<|im_start|>", "user", "what", "<|im_end|>",
                     "<|im_start|>", "assistant", "blue", "circle", "<|im_end|>"]  # fmt: skip
    labelled = [i for i, label in enumerate(encoded.labels) if label != IGNORE_INDEX]
    assert labelled == [6, 7, 8, 15, 16, 17]
    assert all(encoded.labels[i] == encoded.input_ids[i] for i in labelled)


def test_train_on_last_and_all():
    tok = word_tokenizer()
    last = ChatTemplate(tok, "chatml").encode(MESSAGES, train_on="last")
    assert [i for i, label in enumerate(last.labels) if label != IGNORE_INDEX] == [15, 16, 17]
    every = ChatTemplate(tok, "chatml").encode(MESSAGES, train_on="all")
    assert every.labels == every.input_ids


def test_the_tokenizer_s_own_template_is_used_when_it_has_one():
    own = "{% for m in messages %}<|im_start|> {{ m['content'] }} <|im_end|> {% endfor %}"
    encoded = ChatTemplate(word_tokenizer(own)).encode(MESSAGES[:2])
    assert [WORDS[i] for i in encoded.input_ids] == ["<|im_start|>", "hi", "<|im_end|>", "<|im_start|>", "red",
                                                     "square", "<|im_end|>"]  # fmt: skip


def test_a_tokenizer_without_template_needs_a_registered_one():
    with pytest.raises(ValueError, match="carries no chat template"):
        ChatTemplate(word_tokenizer())
    with pytest.raises(KeyError, match="unknown chat template 'chatmll'. Did you mean 'chatml'"):
        ChatTemplate(word_tokenizer(), "chatmll")


def test_a_template_that_is_not_prefix_stable_is_refused():
    # the last user turn is rendered differently from earlier ones: shorter renderings are no prefixes
    register_template(
        "unstable",
        "{% for m in messages %}{% if loop.last %}{{ m['role'] }} {% endif %}{{ m['content'] }} {% endfor %}",
    )
    try:
        with pytest.raises(ValueError, match="not prefix-stable at turn 1"):
            ChatTemplate(word_tokenizer(), "unstable").encode(MESSAGES)
    finally:
        TEMPLATES._items.pop("unstable")
