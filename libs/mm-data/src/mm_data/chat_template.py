"""Chat templates and assistant-only labels.

The text shell of a conversation (role markers, turn ends, system prompt, where media markers go)
comes from the tokenizer's own Jinja chat template (``tokenizer.apply_chat_template``), so nothing
model-specific is copied here. A tokenizer without one takes a template from :data:`TEMPLATES` by
name (plugins register theirs; ``chatml`` is built in).

Labels come from rendering prefixes: the characters an assistant turn adds are those between
``render(turns[:k], add_generation_prompt=True)`` and ``render(turns[:k + 1])``; the full text is
tokenized once with offsets and a token is a label where it lies inside such a span. This needs a
template whose renderings of shorter conversations are prefixes of longer ones, which is checked.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .registry import Registry

__all__ = ["IGNORE_INDEX", "TEMPLATES", "ChatTemplate", "EncodedConversation", "TrainOn", "register_template"]

IGNORE_INDEX = -100
"""Label of tokens that carry no loss (prompt, padding, media)."""

TrainOn = Literal["assistant", "last", "all"]
"""Which tokens are labels: every assistant turn, the last assistant turn, or the whole conversation."""

TEMPLATES = Registry("chat template")
"""Jinja chat templates by name, for tokenizers that carry none."""

register_template = TEMPLATES.register

# A generic ChatML shell for tokenizers without a template (text content only).
register_template(
    "chatml",
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
)


@dataclass
class EncodedConversation:
    """Token ids of a rendered conversation and their labels (:data:`IGNORE_INDEX` where no loss)."""

    input_ids: list[int]
    labels: list[int]
    text: str


class ChatTemplate:
    """Renders messages with ``tokenizer``'s chat template (``name="tokenizer"``) or a registered one."""

    def __init__(self, tokenizer: Any, name: str = "tokenizer") -> None:
        self.tokenizer, self.name = tokenizer, name
        if name == "tokenizer":
            if not getattr(tokenizer, "chat_template", None):
                raise ValueError(
                    f"{type(tokenizer).__name__} carries no chat template; name one of the registered "
                    f"templates {list(TEMPLATES)} (data.dataset.template)"
                )
            self.source: str | None = None
        else:
            self.source = TEMPLATES.get(name)

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = False) -> str:
        """The conversation as text (no tokenization)."""
        return self.tokenizer.apply_chat_template(
            list(messages),
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            chat_template=self.source,
        )

    def encode(
        self, messages: Sequence[Mapping[str, Any]], train_on: TrainOn = "assistant"
    ) -> EncodedConversation:
        """Token ids and labels of ``messages`` (``system``?, then alternating ``user`` / ``assistant``).

        Raises:
            ValueError: the template is not prefix-stable, or the tokenizer gives no offsets.
        """
        text = self.render(messages)
        spans = [(0, len(text))] if train_on == "all" else self._assistant_spans(messages, text)
        if train_on == "last":
            spans = spans[-1:]
        out = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = list(out["input_ids"]), out.get("offset_mapping")
        if offsets is None:
            raise ValueError(
                f"{type(self.tokenizer).__name__} returns no offsets; a fast tokenizer is needed"
            )
        labels = [t if _inside(start, end, spans) else IGNORE_INDEX for t, (start, end) in zip(ids, offsets)]
        return EncodedConversation(ids, labels, text)

    def _assistant_spans(self, messages: Sequence[Mapping[str, Any]], text: str) -> list[tuple[int, int]]:
        spans = []
        for k, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            prompt = self.render(messages[:k], add_generation_prompt=True)
            upto = self.render(messages[: k + 1])
            if not (upto.startswith(prompt) and text.startswith(upto)):
                raise ValueError(
                    f"chat template {self.name!r} is not prefix-stable at turn {k}: rendering fewer turns "
                    "does not give a prefix of the full conversation, so assistant spans cannot be found"
                )
            spans.append((len(prompt), len(upto)))
        return spans


def _inside(start: int, end: int, spans: list[tuple[int, int]]) -> bool:
    return any(lo <= start and end <= hi for lo, hi in spans) and end > start
