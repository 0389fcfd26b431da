"""A renamed config key is refused, and the report names the key that replaced it."""

from __future__ import annotations

import pytest
from mm_config.errors import RENAMED_KEYS


def _nested(dotted: str, value: object) -> dict:
    data: object = value
    for part in reversed(dotted.split(".")):
        data = {part: data}
    return data  # type: ignore[return-value]


CASES = [
    ("model.dcp_cache_dir", "/cache", "checkpoint_conversion_dir"),
    ("model.dcp_conversion_dir", "/cache", "checkpoint_conversion_dir"),
    ("parallel.data_parallel_size", 1, "replicate_parallel_size"),
    ("features.condition_mbs", 2, "condition_micro_steps"),
]


@pytest.mark.parametrize(("old", "value", "new"), CASES)
def test_an_old_key_is_refused_naming_the_new_one(load_error, problem_at, old, value, new):
    data = _nested(old, value)
    if old.startswith("model."):
        data["model"]["model_id"] = "m"
    err = load_error(data)
    assert problem_at(err, old) == f"{old}: unknown key; renamed: use `{new}`"


def test_every_renamed_key_has_a_case():
    assert {(old.rsplit(".", 1)[1], new) for old, _, new in CASES} == set(RENAMED_KEYS.items())
