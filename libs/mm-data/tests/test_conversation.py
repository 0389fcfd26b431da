"""Conversation rows (ShareGPT, OpenAI messages, Alpaca) -> one normalized form, or a clear refusal."""

from __future__ import annotations

import pytest
from mm_data import Conversation, ConversationColumns, ConversationError, Message, to_conversation

WANTED = Conversation(
    messages=[Message("user", "<image>What is it?"), Message("assistant", "A red square.")],
    system="Be brief.",
    images=["/data/a.png"],
)


def test_sharegpt_openai_and_alpaca_rows_give_the_same_conversation():
    sharegpt = {
        "conversations": [
            {"from": "system", "value": "Be brief."},
            {"from": "human", "value": "<image>What is it?"},
            {"from": "gpt", "value": "A red square."},
        ],
        "images": ["a.png"],
    }
    openai = {
        "messages": [
            {"role": "user", "content": "<image>What is it?"},
            {"role": "assistant", "content": "A red square."},
        ],
        "system": "Be brief.",
        "images": "a.png",
    }
    alpaca = {
        "q": "<image>What is",
        "ctx": "it?",
        "a": "A red square.",
        "sys": "Be brief.",
        "pics": ["a.png"],
    }
    alpaca_columns = ConversationColumns(
        formatting="alpaca", prompt="q", query="ctx", response="a", system="sys", images="pics"
    )
    assert to_conversation(sharegpt, ConversationColumns(), "/data") == WANTED
    assert to_conversation(openai, ConversationColumns(formatting="openai"), "/data") == WANTED
    got = to_conversation(alpaca, alpaca_columns, "/data")
    assert got.messages[0] == Message("user", "<image>What is\nit?") and got.images == WANTED.images


def test_renamed_tags_are_read():
    row = {"dialog": [{"who": "me", "text": "hi"}, {"who": "bot", "text": "hello"}]}
    columns = ConversationColumns(
        messages="dialog", role_tag="who", content_tag="text", user_tag="me", assistant_tag="bot"
    )
    assert to_conversation(row, columns, "/").messages == [
        Message("user", "hi"),
        Message("assistant", "hello"),
    ]


@pytest.mark.parametrize(
    ("turns", "message"),
    [
        ([{"from": "gpt", "value": "x"}], "turn 0 is 'assistant'"),
        ([{"from": "human", "value": "x"}], "must end with an assistant turn"),
        ([{"from": "robot", "value": "x"}], "expected 'from' in"),
        ([{"from": "human", "value": "x"}, {"from": "system", "value": "y"}], "system turn must come first"),
    ],
)
def test_rows_that_are_no_conversation_are_refused_with_the_reason(turns, message):
    with pytest.raises(ConversationError, match=message):
        to_conversation({"conversations": turns}, ConversationColumns(), "/")
