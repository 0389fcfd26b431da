"""Plan pattern syntax and match_modules."""

from __future__ import annotations

import pytest
from mm_parallel import PatternMatchError, match_modules, pattern_matches, unmatched_segment


@pytest.mark.parametrize(
    ("pattern", "path", "expected"),
    [
        ("predictor.blocks.{*}", "predictor.blocks.12", True),
        ("predictor.blocks.{*}", "predictor.blocks.12.mlp", False),  # full match only
        ("predictor.blocks.{*}", "predictor.blocks.x", False),  # integer segment only
        ("blocks.{1-3}", "blocks.3", True),
        ("blocks.{1-3}", "blocks.4", False),
        ("blocks.{1-3}", "blocks.0", False),
        ("*.mlp", "predictor.blocks.0.mlp", True),  # * crosses dots
        ("blocks.?", "blocks.7", True),
        ("blocks.?", "blocks.10", False),
        ("text_encoder", "text_encoder.layers", False),
        ("a.b", "aXb", False),  # dots are literal
    ],
)
def test_pattern_syntax(pattern: str, path: str, expected: bool) -> None:
    assert pattern_matches(pattern, path) is expected


def test_match_modules_returns_paths_in_module_order(toy) -> None:
    model = toy.make_container()
    found = match_modules(model, ["predictor.blocks.{0-1}", "*.norm", "ae"])
    assert found == {
        "predictor.blocks.{0-1}": ["predictor.blocks.0", "predictor.blocks.1"],
        "*.norm": [
            "text_encoder.norm",
            "predictor.blocks.0.norm",
            "predictor.blocks.1.norm",
            "predictor.blocks.2.norm",
        ],
        "ae": ["ae"],
    }


def test_typo_names_the_closest_module_path(toy) -> None:
    with pytest.raises(PatternMatchError, match=r"'predictor\.blokcs\.\{\*\}'.*closest.*'predictor\.blocks"):
        match_modules(toy.make_container(), ["predictor.blokcs.{*}"], what="parallel.fsdp_plan.apply_modules")
    with pytest.raises(PatternMatchError, match=r"parallel\.fsdp_plan\.apply_modules.*'text_encoder'"):
        match_modules(toy.make_container(), ["text_encodr"], what="parallel.fsdp_plan.apply_modules")


def test_non_strict_reports_no_match_as_empty(toy) -> None:
    assert match_modules(toy.make_container(), ["nothing.here"], strict=False) == {"nothing.here": []}


def test_empty_range_is_rejected(toy) -> None:
    with pytest.raises(ValueError, match="range"):
        match_modules(toy.make_container(), ["predictor.blocks.{3-1}"])


PATHS = ["predictor", "predictor.blocks", "predictor.blocks.0", "predictor.blocks.0.attn1", "predictor.blocks.1",
         "predictor.blocks.1.attn1", "predictor.head", "text_encoder", "text_encoder.layers"]  # fmt: skip


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        ("predictor.blocks.{*}.atn", "segment `atn` matches no module under `predictor.blocks.{*}` (2 module(s), "
         "e.g. `predictor.blocks.0`); did you mean `attn1`?"),
        ("predictor.blokcs.{*}", "segment `blokcs` matches no module under `predictor` (1 module(s), e.g. "
         "`predictor`); did you mean `blocks`?"),
        ("predictr.blocks", "segment `predictr` matches no module at the top level; did you mean `predictor`?"),
        ("*.atn1", "segment `atn1` matches no module under `*`"),
        ("predictor.blocks.{5-9}", "segment `{5-9}` matches no module under `predictor.blocks`"),
    ],
)  # fmt: skip
def test_unmatched_segment_names_the_first_segment_that_matches_nothing(pattern: str, reason: str) -> None:
    assert unmatched_segment(pattern, PATHS).startswith(reason)
