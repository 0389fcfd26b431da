"""transformers is an extra of mm-trainer (`mm-trainer[transformers]`): a feature that needs it, without
it installed, says so and names the extra."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from mm_trainer.data.conversation import load_processor_parts


def test_the_conversation_processor_without_transformers_names_the_extra(tmp_path: Path, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if not installed: import raises
    with pytest.raises(
        ImportError, match=r"data\.dataset\.processor .*pip install 'mm-trainer\[transformers\]'"
    ):
        load_processor_parts(str(tmp_path))
