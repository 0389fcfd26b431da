"""Shared building blocks of the schema: the strict base model and reusable field types."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    create_model,
)

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

    Types are strict: YAML already types its values, so nothing is coerced (``true`` is not the
    integer 1, ``"3"`` is not 3; an integer is still a valid float). Numbers are finite: YAML's
    ``.inf`` / ``.nan`` are refused wherever a float is expected (an infinite ``training.lr`` passes
    every ``ge=0`` bound and trains nothing but NaN). Plugin schemas (see
    :func:`mm_config.register_model_schema`) should subclass it too, so that their typos are
    caught like the framework's own.
    """

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        allow_inf_nan=False,
        use_attribute_docstrings=True,
        validate_default=True,
        populate_by_name=False,
    )


class PartialConfigModel(ConfigModel):
    """A plugin schema whose keys override another source (a checkpoint's ``config.json``, a recipe's
    defaults): every key is validated, but only the keys the YAML sets are kept, so a schema default
    never overrides what the source says (defaults document the source's own, and are not validated)."""

    model_config = ConfigDict(validate_default=False)


def keyword_schema(name: str, fields: Mapping[str, Any], owner: str) -> type[PartialConfigModel]:
    """A :class:`PartialConfigModel` for the keyword arguments of an upstream constructor.

    ``fields`` maps each accepted keyword to its type; ``owner`` names the constructor (e.g.
    ``"diffusers.AutoencoderKLWan"``) in the docs. A plugin whose ``config`` section is passed to
    such a constructor registers it so that a misspelt or mistyped keyword fails the config check
    (upstream ``**kwargs`` would often swallow it). Test the keys against the signature where the
    upstream package is importable.
    """
    definitions: dict[str, Any] = {
        key: (tp, Field(default=None, description=f"``{owner}({key}=...)``")) for key, tp in fields.items()
    }
    doc = f"Keyword arguments of ``{owner}``; only the keys set are passed on."
    return create_model(name, __base__=PartialConfigModel, __doc__=doc, **definitions)


def _normalize_dtype(value: Any) -> Any:
    if value is None or not isinstance(value, str):
        return value
    key = value.strip().lower()
    if key not in _DTYPE_ALIASES:
        raise ValueError("expected one of fp32, bf16, fp16 (or float32, bfloat16, float16)")
    return _DTYPE_ALIASES[key]


DType = Annotated[Literal["fp32", "bf16", "fp16"] | None, BeforeValidator(_normalize_dtype)]
"""A dtype name, normalized to ``fp32``/``bf16``/``fp16``; ``None`` keeps the framework default."""

FLOAT32_MAX = 3.4028234663852886e38
"""The largest finite float32: the largest learning rate AdamW can apply to float32 weights."""


def _fits_float32(value: float) -> float:
    if value > FLOAT32_MAX:
        raise ValueError(
            f"overflows float32 (largest {FLOAT32_MAX:.4g}): AdamW applies the rate to float32 tensors, which "
            "cannot hold it (the first update fails: 'value cannot be converted to type float without overflow')"
        )
    return value


LearningRate = Annotated[float, Field(ge=0), AfterValidator(_fits_float32)]
"""A learning rate: a finite float >= 0 that float32 can hold."""

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


def _check_exists(value: str, info: ValidationInfo) -> str:
    if not (isinstance(info.context, dict) and info.context.get("check_paths")) or Path(value).exists():
        return value
    where = "" if Path(value).is_absolute() else f" (relative to the working directory {Path.cwd()})"
    raise ValueError(f"path not found{where}")


InputPath = Annotated[str, AfterValidator(_check_exists)]
"""A file or directory the run reads; it must exist when the validation context has ``check_paths``."""


def pattern_head(pattern: str) -> str | None:
    """First dot-separated segment of ``pattern`` when it is a literal name (no wildcard), else None."""
    head = pattern.split(".", 1)[0]
    return None if any(c in head for c in "*?{}[]") else head
