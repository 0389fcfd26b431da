"""Conversation records: ShareGPT, OpenAI-messages and Alpaca rows mapped to one form.

A :class:`ConversationColumns` says where a row keeps its turns, system prompt and media (the
``attr`` mapping of LLaMA-Factory's dataset_info): ``formatting`` picks the layout and every column
or tag name can be renamed. :func:`to_conversation` turns one row into a :class:`Conversation`
(system prompt, alternating user/assistant :class:`Message` s ending with an assistant turn,
absolute image and video paths) or raises :class:`ConversationError` saying what is wrong.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = ["Conversation", "ConversationColumns", "ConversationError", "Message", "to_conversation"]

Formatting = Literal["sharegpt", "openai", "alpaca"]

_TAGS: dict[str, dict[str, str]] = {
    "sharegpt": {"messages": "conversations", "role_tag": "from", "content_tag": "value",
                 "user_tag": "human", "assistant_tag": "gpt", "system_tag": "system"},
    "openai": {"messages": "messages", "role_tag": "role", "content_tag": "content",
               "user_tag": "user", "assistant_tag": "assistant", "system_tag": "system"},
    "alpaca": {"messages": "", "role_tag": "", "content_tag": "", "user_tag": "", "assistant_tag": "",
               "system_tag": ""},
}  # fmt: skip


class ConversationError(ValueError):
    """A row that is not a usable conversation (the message names the column or turn)."""


@dataclass(frozen=True)
class Message:
    """One turn: ``role`` is ``user`` or ``assistant``; ``content`` may hold media placeholders."""

    role: str
    content: str


@dataclass
class Conversation:
    """A normalized training sample: optional system prompt, turns, and media paths in order."""

    messages: list[Message]
    system: str | None = None
    images: list[str] = field(default_factory=list)
    videos: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ConversationColumns:
    """Where a row keeps each part; unset tag/column names take the ``formatting`` defaults.

    ``sharegpt``: ``conversations: [{from: human|gpt|system, value}]``; ``openai``:
    ``messages: [{role: user|assistant|system, content}]``; ``alpaca``: ``prompt`` (+ ``query``)
    is the user turn and ``response`` the assistant turn.
    """

    formatting: Formatting = "sharegpt"
    messages: str | None = None
    system: str | None = "system"
    images: str | None = "images"
    videos: str | None = "videos"
    prompt: str = "instruction"
    query: str = "input"
    response: str = "output"
    role_tag: str | None = None
    content_tag: str | None = None
    user_tag: str | None = None
    assistant_tag: str | None = None
    system_tag: str | None = None

    def __post_init__(self) -> None:
        if self.formatting not in _TAGS:
            raise ValueError(f"formatting {self.formatting!r}: expected one of {sorted(_TAGS)}")
        for name, default in _TAGS[self.formatting].items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, default)


def to_conversation(row: Mapping[str, Any], columns: ConversationColumns, root: str | Path) -> Conversation:
    """Normalize ``row``; relative media paths are resolved against ``root``.

    Raises:
        ConversationError: missing columns, unknown roles, turns that do not alternate
            user/assistant, no final assistant turn, or media lists that are not lists of paths.
    """
    if not isinstance(row, Mapping):
        raise ConversationError(f"expected an object, got {type(row).__name__}")
    system = (
        _text(row.get(columns.system), columns.system) if columns.system and row.get(columns.system) else None
    )
    if columns.formatting == "alpaca":
        messages = _alpaca(row, columns)
    else:
        system, messages = _turns(row, columns, system)
    _check_order(messages)
    return Conversation(
        messages=messages,
        system=system,
        images=_paths(row, columns.images, root),
        videos=_paths(row, columns.videos, root),
    )


def _alpaca(row: Mapping[str, Any], c: ConversationColumns) -> list[Message]:
    for key in (c.prompt, c.response):
        if not isinstance(row.get(key), str):
            raise ConversationError(f"column {key!r}: expected a string, got {row.get(key)!r}")
    prompt = row[c.prompt] + (
        f"\n{row[c.query]}" if isinstance(row.get(c.query), str) and row[c.query] else ""
    )
    return [Message("user", prompt), Message("assistant", row[c.response])]


def _turns(
    row: Mapping[str, Any], c: ConversationColumns, system: str | None
) -> tuple[str | None, list[Message]]:
    turns = row.get(c.messages)
    if not isinstance(turns, list) or not turns:
        raise ConversationError(f"column {c.messages!r}: expected a non-empty list of turns, got {turns!r}")
    roles = {c.user_tag: "user", c.assistant_tag: "assistant", c.system_tag: "system"}
    messages: list[Message] = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, Mapping) or turn.get(c.role_tag) not in roles:
            raise ConversationError(
                f"column {c.messages!r} turn {i}: expected {c.role_tag!r} in {sorted(roles)}, got {turn!r}"
            )
        content = _text(turn.get(c.content_tag), f"{c.messages}[{i}].{c.content_tag}")
        role = roles[turn[c.role_tag]]
        if role == "system":
            if i != 0:
                raise ConversationError(f"column {c.messages!r} turn {i}: a system turn must come first")
            system = content
        else:
            messages.append(Message(role, content))
    return system, messages


def _check_order(messages: list[Message]) -> None:
    for i, message in enumerate(messages):
        expected = "user" if i % 2 == 0 else "assistant"
        if message.role != expected:
            raise ConversationError(f"turn {i} is {message.role!r}; turns must alternate user, assistant")
    if not messages or messages[-1].role != "assistant":
        raise ConversationError("the conversation must end with an assistant turn (the training target)")


def _text(value: Any, where: str | None) -> str:
    if not isinstance(value, str):
        raise ConversationError(f"{where}: expected a string, got {value!r}")
    return value


def _paths(row: Mapping[str, Any], column: str | None, root: str | Path) -> list[str]:
    value = row.get(column) if column else None
    if value is None:
        return []
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(p, str) for p in items):
        raise ConversationError(f"column {column!r}: expected a path or a list of paths, got {value!r}")
    return [p if Path(p).is_absolute() else str(Path(root) / p) for p in items]
