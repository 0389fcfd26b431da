"""Shared building blocks of the schema: the strict base model and reusable field types."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict

_DTYPE_ALIASES = {
    "fp32": "fp32",
    "float32": "fp32",
    "float": "fp32",
    "torch.float32": "fp32",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "torch.bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "torch.float16": "fp16",
}


class ConfigModel(BaseModel):
    """Base of every config section: unknown keys are errors and attribute docstrings document fields.

    Plugin schemas (see :func:`mm_config.register_model_schema`) should subclass it too, so that
    their typos are caught like the framework's own.
    """

    model_config = ConfigDict(
        extra="forbid",
        use_attribute_docstrings=True,
        validate_default=True,
        populate_by_name=False,
    )


def _normalize_dtype(value: Any) -> Any:
    if value is None or not isinstance(value, str):
        return value
    key = value.strip().lower()
    if key not in _DTYPE_ALIASES:
        raise ValueError("expected one of fp32, bf16, fp16 (or float32, bfloat16, float16)")
    return _DTYPE_ALIASES[key]


DType = Annotated[Literal["fp32", "bf16", "fp16"] | None, BeforeValidator(_normalize_dtype)]
"""A dtype name, normalized to ``fp32``/``bf16``/``fp16``; ``None`` keeps the framework default."""

_BRACE = re.compile(r"\{([^{}]*)\}")


def _check_pattern(pattern: str) -> str:
    if not pattern or pattern != pattern.strip():
        raise ValueError(
            f"expected a non-empty module path pattern without surrounding spaces, got {pattern!r}"
        )
    for body in _BRACE.findall(pattern):
        if body == "*":
            continue
        m = re.fullmatch(r"(\d+)-(\d+)", body)
        if not m or int(m.group(1)) > int(m.group(2)):
            raise ValueError(
                f"bad brace group {{{body}}} in {pattern!r}: expected {{*}} (one integer segment) "
                "or {a-b} (inclusive integer range with a <= b)"
            )
    if "{" in _BRACE.sub("", pattern) or "}" in _BRACE.sub("", pattern):
        raise ValueError(f"unbalanced braces in module pattern {pattern!r}")
    return pattern


ModulePattern = Annotated[str, AfterValidator(_check_pattern)]
"""A module path pattern: ``{*}`` one integer segment, ``{a-b}`` a range, ``*`` anything, ``?`` one char."""


def pattern_head(pattern: str) -> str | None:
    """First dot-separated segment of ``pattern`` when it is a literal name (no wildcard), else None."""
    head = pattern.split(".", 1)[0]
    return None if any(c in head for c in "*?{}[]") else head
