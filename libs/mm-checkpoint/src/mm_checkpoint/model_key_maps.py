"""Key maps of the models the project supports, shipped inside mm-checkpoint as data.

Each ``key_map_tables/<model_type>.json`` holds an ordered list of ``[checkpoint key, model key]``
templates (the first matching rule wins) and whether unmatched keys pass through. In a template
``{i}`` stands for a block index (digits) and ``{param}`` for ``weight`` or ``bias``; everything else
is literal and the whole key must match. So ``mm-ckpt convert --model-type wan2_2`` works with
mm-checkpoint alone, and the applications use the same table (one copy).

Tables: ``wan2_2`` (diffusers ``WanTransformer3DModel`` <-> the native Wan2.x layout). LTX-2 needs
none: ltx2-train trains diffusers' own module tree, so its keys are upstream's unchanged.
"""

from __future__ import annotations

import json
import re
from functools import cache
from importlib import resources

from .errors import KeyMapError
from .key_maps import KeyMapTransform, RenameRule

PLACEHOLDERS: dict[str, str] = {"{i}": r"(\d+)", "{param}": r"(weight|bias)"}
"""Template placeholders and the regex group each stands for."""

_PLACEHOLDER = re.compile("|".join(re.escape(p) for p in PLACEHOLDERS))
_TABLES = "key_map_tables"


def _pattern(template: str) -> str:
    parts = _PLACEHOLDER.split(template)
    body = "".join(
        re.escape(literal) + (PLACEHOLDERS[p] if p else "")
        for literal, p in zip(parts, [*_PLACEHOLDER.findall(template), ""], strict=True)
    )
    return f"^{body}$"


def _replacement(source: str, target: str) -> str:
    groups = _PLACEHOLDER.findall(source)
    wanted = _PLACEHOLDER.findall(target)
    if sorted(groups) != sorted(wanted) or len(set(groups)) != len(groups):
        raise KeyMapError(
            f"key templates {source!r} -> {target!r}: both sides need the same placeholders, each once "
            f"(placeholders: {sorted(PLACEHOLDERS)})"
        )
    parts = _PLACEHOLDER.split(target)
    return "".join(
        literal.replace("\\", "\\\\") + (f"\\g<{groups.index(p) + 1}>" if p else "")
        for literal, p in zip(parts, [*wanted, ""], strict=True)
    )


def template_rule(checkpoint_key: str, model_key: str) -> RenameRule:
    """A full-key :class:`RenameRule` from two key templates, with its explicit inverse.

    Example: ``template_rule("blocks.{i}.attn1.to_q.{param}", "blocks.{i}.self_attn.q.{param}")``.
    """
    return RenameRule(
        _pattern(checkpoint_key),
        _replacement(checkpoint_key, model_key),
        inverse_pattern=_pattern(model_key),
        inverse_replacement=_replacement(model_key, checkpoint_key),
    )


def builtin_model_types() -> list[str]:
    """The model types whose key map ships with mm-checkpoint (``wan2_2``)."""
    folder = resources.files("mm_checkpoint") / _TABLES
    return sorted(f.name.removesuffix(".json") for f in folder.iterdir() if f.name.endswith(".json"))


@cache
def builtin_key_map(model_type: str) -> KeyMapTransform:
    """The shipped key map of ``model_type`` (read once).

    Raises:
        KeyMapError: no table of that name ships, or the table file is malformed (naming it).
    """
    if model_type not in builtin_model_types():
        raise KeyMapError(
            f"no key map named {model_type!r} ships with mm-checkpoint; shipped: {builtin_model_types()}"
        )
    source = resources.files("mm_checkpoint") / _TABLES / f"{model_type}.json"
    table = json.loads(source.read_text())
    rules, passthrough = table.get("rules"), table.get("passthrough")
    if (
        not isinstance(rules, list)
        or not isinstance(passthrough, bool)
        or not all(isinstance(r, list) and len(r) == 2 and all(isinstance(k, str) for k in r) for r in rules)
    ):
        raise KeyMapError(
            f"{source}: expected 'rules' (a list of [checkpoint key, model key] templates) and "
            "'passthrough' (true or false)"
        )
    return KeyMapTransform([template_rule(a, b) for a, b in rules], passthrough=passthrough)
