"""Key maps of the models the project supports, shipped inside mm-checkpoint as data.

Each ``key_map_tables/<model_type>.json`` holds an ordered list of ``[checkpoint key, model key]``
templates (the first matching rule wins) and whether unmatched keys pass through. In a template
``{i}`` and ``{j}`` stand for block indices (digits) and ``{param}`` for ``weight`` or ``bias``;
everything else is literal and the whole key must match. A table may also list ``sequences``: flat
``nn.Sequential`` indices regrouped under named slots before the templates apply
(:class:`~mm_checkpoint.regroup.SequenceRegroup`, fields ``checkpoint``, ``item``, ``closer``,
``item_children``, ``closer_children``). So ``mm-ckpt convert --model-type wan2_2`` works with
mm-checkpoint alone, and the applications use the same tables (one copy).

Tables (each with ``passthrough``: the model's own layout loads through the same map):

- ``wan2_2``: diffusers ``WanTransformer3DModel`` <-> the native Wan2.x DiT layout;
- ``wan2_1_vae`` / ``wan2_2_vae``: the official ``Wan2.1_VAE.pth`` / ``Wan2.2_VAE.pth`` (and ComfyUI's
  ``wan_2.1_vae`` / ``wan2.2_vae`` files, the same names) -> diffusers ``AutoencoderKLWan``;
- ``umt5``: the official ``models_t5_umt5-xxl-enc-bf16.pth`` -> transformers ``UMT5EncoderModel``.

- ``ltx2``: the official LTX-2 transformer names (Lightricks' single files, the official trainer's and
  ComfyUI's LoRA files) -> diffusers ``LTX2VideoTransformer3DModel`` (ltx2-train trains diffusers' module
  tree, so a diffusers folder loads with no map).
"""

from __future__ import annotations

import json
import re
from functools import cache
from importlib import resources

from .errors import KeyMapError
from .key_maps import KeyMapTransform, RenameRule, WeightTransform
from .regroup import RegroupTransform, SequenceRegroup

PLACEHOLDERS: dict[str, str] = {"{i}": r"(\d+)", "{j}": r"(\d+)", "{param}": r"(weight|bias)"}
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
    """The model types whose key map ships with mm-checkpoint (``ltx2``, ``umt5``, ``wan2_1_vae``,
    ``wan2_2``, ``wan2_2_vae``)."""
    folder = resources.files("mm_checkpoint") / _TABLES
    return sorted(f.name.removesuffix(".json") for f in folder.iterdir() if f.name.endswith(".json"))


@cache
def builtin_key_map(model_type: str) -> WeightTransform:
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
    table_map = KeyMapTransform([template_rule(a, b) for a, b in rules], passthrough=passthrough)
    sequences = table.get("sequences", [])
    if not sequences:
        return table_map
    try:
        regroups = [
            SequenceRegroup(
                s["checkpoint"],
                s["item"],
                s["closer"],
                tuple(s["item_children"]),
                tuple(s["closer_children"]),
            )
            for s in sequences
        ]
    except (KeyError, TypeError) as err:
        raise KeyMapError(
            f"{source}: each of 'sequences' needs checkpoint, item, closer, item_children, closer_children ({err})"
        ) from None
    return RegroupTransform(regroups, table_map)
