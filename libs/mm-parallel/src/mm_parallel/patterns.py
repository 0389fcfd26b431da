"""Module-path patterns used by FSDP plans (and by feature plans upstream).

Syntax (a pattern must match the whole dotted module path):

- ``{*}``   one integer path segment: ``predictor.blocks.{*}`` = every block;
- ``{a-b}`` one integer segment in the inclusive range a..b: ``blocks.{0-3}``;
- ``*``     any characters, dots included: ``*.attn``;
- ``?``     exactly one character;
- anything else is literal; a brace outside ``{*}`` / ``{a-b}`` is an error.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence

from torch import nn

_TOKEN = re.compile(r"\{\*\}|\{(\d+)-(\d+)\}|\*|\?")


class PatternMatchError(ValueError):
    """A plan pattern matched no module; the message lists the closest module paths."""


def compile_pattern(pattern: str) -> tuple[re.Pattern[str], list[tuple[int, int]]]:
    """Translate a plan pattern into a full-match regex and the integer ranges of its ``{a-b}`` groups."""
    parts: list[str] = []
    ranges: list[tuple[int, int]] = []
    pos = 0
    for token in _TOKEN.finditer(pattern):
        parts.append(re.escape(pattern[pos : token.start()]))
        text = token.group(0)
        if text == "{*}":
            parts.append(r"\d+")
        elif text == "*":
            parts.append(r".*")
        elif text == "?":
            parts.append(r".")
        else:
            low, high = int(token.group(1)), int(token.group(2))
            if low > high:
                raise ValueError(f"pattern {pattern!r}: range {{{low}-{high}}} is empty (start > end)")
            parts.append(r"(\d+)")
            ranges.append((low, high))
        pos = token.end()
    parts.append(re.escape(pattern[pos:]))
    literal = _TOKEN.sub("", pattern)
    if "{" in literal or "}" in literal:
        raise ValueError(
            f"pattern {pattern!r}: bad brace group; expected {{*}} (one integer segment) or {{a-b}} "
            "(inclusive integer range with a <= b)"
        )
    return re.compile("".join(parts)), ranges


def check_pattern(pattern: str, key: str) -> None:
    """Raise ValueError naming ``key`` unless ``pattern`` is a non-empty, well-formed plan pattern."""
    if not pattern or pattern != pattern.strip():
        raise ValueError(f"{key}: expected a non-empty pattern without surrounding spaces, got {pattern!r}")
    try:
        compile_pattern(pattern)
    except ValueError as err:
        raise ValueError(f"{key}: {err}") from None


def pattern_matches(pattern: str, path: str) -> bool:
    """True when ``pattern`` fully matches the dotted module ``path``."""
    regex, ranges = compile_pattern(pattern)
    found = regex.fullmatch(path)
    if found is None:
        return False
    return all(low <= int(value) <= high for value, (low, high) in zip(found.groups(), ranges))


def closest_paths(pattern: str, paths: Iterable[str], limit: int = 3) -> list[str]:
    """Module paths most similar to ``pattern`` (integer segments compared as ``{*}``)."""

    def score(path: str) -> float:
        generic = ".".join("{*}" if part.isdigit() else part for part in path.split("."))
        return max(
            difflib.SequenceMatcher(None, pattern, path).ratio(),
            difflib.SequenceMatcher(None, pattern, generic).ratio(),
        )

    ranked = sorted((p for p in paths if p), key=lambda p: (-score(p), p))
    return ranked[:limit]


def unmatched_segment(pattern: str, paths: Sequence[str]) -> str:
    """Why ``pattern`` matches none of ``paths``, segment by segment (a config check's message).

    The pattern's dot-separated segments are matched as growing prefixes (``predictor``,
    ``predictor.blocks``, ``predictor.blocks.{*}``, ...) against the paths; the first prefix that matches
    nothing names the segment at fault, the modules its shorter prefix still matched, and the closest of
    the names their children really have (integer names shown as ``{*}``).
    """
    segments = pattern.split(".")
    matched: list[str] = []
    for k in range(1, len(segments) + 1):
        hits = [path for path in paths if pattern_matches(".".join(segments[:k]), path)]
        if not hits:
            break
        matched = hits
    else:
        return f"`{pattern}` matches {len(matched)} module(s)"
    bad = segments[k - 1]
    if k == 1:
        children = {path.split(".", 1)[0] for path in paths}
        where = "at the top level"
    else:
        children = {p[len(h) + 1 :].split(".", 1)[0] for h in matched for p in paths if p.startswith(h + ".")}
        prefix = ".".join(segments[: k - 1])
        where = f"under `{prefix}` ({len(matched)} module(s), e.g. `{matched[0]}`)"
    names = sorted({"{*}" if c.isdigit() else c for c in children})
    close = difflib.get_close_matches(bad, names, n=1, cutoff=0.5)
    hint = f"did you mean `{close[0]}`?" if close else f"names there: {', '.join(names[:12]) or 'none'}"
    return f"segment `{bad}` matches no module {where}; {hint}"


def module_paths(model: nn.Module) -> list[str]:
    """Dotted paths of every submodule of ``model`` in registration (pre-)order, root excluded."""
    return [name for name, _ in model.named_modules() if name]


def match_modules(
    model: nn.Module, patterns: Iterable[str], *, strict: bool = True, what: str = "pattern"
) -> dict[str, list[str]]:
    """Map each pattern to the module paths of ``model`` it fully matches (pre-order).

    With ``strict`` a pattern that matches nothing raises :class:`PatternMatchError`
    naming the closest module paths; otherwise it maps to an empty list. ``what`` names
    the plan key in error messages (e.g. ``"parallel.fsdp_plan.apply_modules"``).
    """
    paths = module_paths(model)
    result: dict[str, list[str]] = {}
    for pattern in patterns:
        if not isinstance(pattern, str) or not pattern:
            raise ValueError(f"{what}: patterns must be non-empty strings, got {pattern!r}")
        result[pattern] = [path for path in paths if pattern_matches(pattern, path)]
        if strict and not result[pattern]:
            close = ", ".join(repr(p) for p in closest_paths(pattern, paths))
            raise PatternMatchError(
                f"{what}: pattern {pattern!r} matches no module of {type(model).__name__}; "
                f"closest module paths: {close or '(model has no submodules)'}"
            )
    return result
