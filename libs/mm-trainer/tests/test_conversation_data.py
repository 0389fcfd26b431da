"""The conversation dataset's two views agree: the schema (mm-config) and the dataclasses (mm-data)."""

from __future__ import annotations

import dataclasses

from mm_config import ConversationColumnsConfig, ConversationDatasetConfig
from mm_data import ConversationColumns, MediaBudget


def test_column_schema_and_dataclass_have_the_same_keys_and_defaults():
    schema = {name: field.default for name, field in ConversationColumnsConfig.model_fields.items()}
    dataclass = {f.name: f.default for f in dataclasses.fields(ConversationColumns) if f.name != "formatting"}
    assert schema == dataclass
    assert ConversationDatasetConfig.model_fields["formatting"].default == ConversationColumns.formatting


def test_media_budget_defaults_are_the_schema_defaults():
    fields = ConversationDatasetConfig.model_fields
    assert {f.name: f.default for f in dataclasses.fields(MediaBudget)} == {
        f.name: fields[f.name].default for f in dataclasses.fields(MediaBudget)
    }
