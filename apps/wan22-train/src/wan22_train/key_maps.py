"""diffusers `WanTransformer3DModel` <-> native Wan (`WanDiT`) state dicts through mm-checkpoint's `wan2_2` map.

The table itself ships with mm-checkpoint as data (``mm_checkpoint/key_map_tables/wan2_2.json``), so
``mm-ckpt convert --model-type wan2_2`` works without this app; here are two strict, pure functions
over it. A key matching no rule is an error naming it, so weights of features WanDiT does not
implement (e.g. the Wan2.1 I2V CLIP branch) never load silently.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

from mm_checkpoint import KeyMapError, KeyMapTransform, get_weight_transform

T = TypeVar("T")

WAN22_KEY_MAP: KeyMapTransform = get_weight_transform("wan2_2")  # type: ignore[assignment]
"""mm-checkpoint's ``wan2_2`` map. Native keys match no rule and pass through, so official native
checkpoints load through it too (no native key looks like a diffusers one)."""

_STRICT = KeyMapTransform(WAN22_KEY_MAP.rules, passthrough=False)


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
