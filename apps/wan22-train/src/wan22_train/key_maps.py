"""The `wan2_2` key map: diffusers `WanTransformer3DModel` <-> native Wan (`WanDiT`) state-dict keys.

Data, the mm-checkpoint transform built from it (registered as ``wan2_2``), and two pure functions. Each table is an ordered tuple of
`(full-match regex, replacement)` pairs; a key matching no pattern is an error naming it, so weights of
features WanDiT does not implement (e.g. the Wan2.1 I2V CLIP branch) never load silently.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import TypeVar

from mm_checkpoint import KeyMapError, KeyMapTransform, RenameRule, register_weight_transform

T = TypeVar("T")

# (diffusers prefix, native prefix); `{i}` is a block index. Every parameter below each prefix is
# renamed with its suffix kept (`weight`, `bias`), except the two modulation tables (no suffix).
_PREFIXES: tuple[tuple[str, str], ...] = (
    ("patch_embedding.", "patch_embedding."),
    ("condition_embedder.text_embedder.linear_1.", "text_embedding.0."),
    ("condition_embedder.text_embedder.linear_2.", "text_embedding.2."),
    ("condition_embedder.time_embedder.linear_1.", "time_embedding.0."),
    ("condition_embedder.time_embedder.linear_2.", "time_embedding.2."),
    ("condition_embedder.time_proj.", "time_projection.1."),
    ("blocks.{i}.attn1.to_q.", "blocks.{i}.self_attn.q."),
    ("blocks.{i}.attn1.to_k.", "blocks.{i}.self_attn.k."),
    ("blocks.{i}.attn1.to_v.", "blocks.{i}.self_attn.v."),
    ("blocks.{i}.attn1.to_out.0.", "blocks.{i}.self_attn.o."),
    ("blocks.{i}.attn1.norm_q.", "blocks.{i}.self_attn.norm_q."),
    ("blocks.{i}.attn1.norm_k.", "blocks.{i}.self_attn.norm_k."),
    ("blocks.{i}.attn2.to_q.", "blocks.{i}.cross_attn.q."),
    ("blocks.{i}.attn2.to_k.", "blocks.{i}.cross_attn.k."),
    ("blocks.{i}.attn2.to_v.", "blocks.{i}.cross_attn.v."),
    ("blocks.{i}.attn2.to_out.0.", "blocks.{i}.cross_attn.o."),
    ("blocks.{i}.attn2.norm_q.", "blocks.{i}.cross_attn.norm_q."),
    ("blocks.{i}.attn2.norm_k.", "blocks.{i}.cross_attn.norm_k."),
    ("blocks.{i}.norm2.", "blocks.{i}.norm3."),  # diffusers' cross-attention norm is Wan's norm3
    ("blocks.{i}.ffn.net.0.proj.", "blocks.{i}.ffn.0."),
    ("blocks.{i}.ffn.net.2.", "blocks.{i}.ffn.2."),
    ("proj_out.", "head.head."),
)
_TABLES: tuple[tuple[str, str], ...] = (
    ("blocks.{i}.scale_shift_table", "blocks.{i}.modulation"),
    ("scale_shift_table", "head.modulation"),
)


def _pattern(template: str, suffix: bool) -> str:
    # numbered groups only (block index first, then the parameter suffix): mm-checkpoint inverts these
    body = re.escape(template).replace(r"\{i\}", r"(\d+)")
    return "^" + body + (r"(weight|bias)" if suffix else "") + "$"


def _replacement(template: str, suffix: bool) -> str:
    indexed = "{i}" in template
    out = template.replace("{i}", r"\g<1>")
    return out + ((r"\g<2>" if indexed else r"\g<1>") if suffix else "")


def _table(forward: bool) -> tuple[tuple[str, str], ...]:
    pairs = [(a, b, True) for a, b in _PREFIXES] + [(a, b, False) for a, b in _TABLES]
    return tuple(
        (_pattern(src, sfx), _replacement(dst, sfx))
        for diffusers, native, sfx in pairs
        for src, dst in [(diffusers, native) if forward else (native, diffusers)]
    )


WAN22_DIFFUSERS_TO_NATIVE: tuple[tuple[str, str], ...] = _table(forward=True)
"""Ordered (diffusers full-match regex, native replacement) pairs: the `wan2_2` map."""

WAN22_NATIVE_TO_DIFFUSERS: tuple[tuple[str, str], ...] = _table(forward=False)
"""Ordered (native full-match regex, diffusers replacement) pairs: the inverse `wan2_2` map."""


def _key_map(passthrough: bool) -> KeyMapTransform:
    rules = [
        RenameRule(pattern, replacement, inverse_pattern=inv_pattern, inverse_replacement=inv_replacement)
        for (pattern, replacement), (inv_pattern, inv_replacement) in zip(
            WAN22_DIFFUSERS_TO_NATIVE, WAN22_NATIVE_TO_DIFFUSERS, strict=True
        )
    ]
    return KeyMapTransform(rules, passthrough=passthrough)


WAN22_KEY_MAP: KeyMapTransform = _key_map(passthrough=True)
"""The ``wan2_2`` map registered in mm-checkpoint. Native keys match no rule and pass through, so
official native checkpoints load through it too (no native key looks like a diffusers one)."""
register_weight_transform("wan2_2", WAN22_KEY_MAP)

_STRICT = _key_map(passthrough=False)


def _rename(state: Mapping[str, T], rename: Callable[[str], str]) -> dict[str, T]:
    out: dict[str, T] = {}
    for key, value in state.items():
        try:
            new = rename(key)
        except KeyMapError as err:  # a weight of a feature WanDiT does not implement (e.g. a CLIP branch)
            raise KeyError(f"no wan2_2 key-map rule matches {key!r}") from err
        if new in out:
            raise ValueError(f"two keys map to {new!r} (the second is {key!r})")
        out[new] = value
    return out


def diffusers_to_native(state: Mapping[str, T]) -> dict[str, T]:
    """Diffusers `WanTransformer3DModel` state dict -> native `WanDiT` keys (every key must match a rule)."""
    return _rename(state, _STRICT.forward)


def native_to_diffusers(state: Mapping[str, T]) -> dict[str, T]:
    """Native `WanDiT` state dict -> diffusers `WanTransformer3DModel` keys (every key must match a rule)."""
    return _rename(state, _STRICT.inverse)
