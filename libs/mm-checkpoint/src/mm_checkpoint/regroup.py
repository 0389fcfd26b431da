"""Key maps between a flat ``nn.Sequential`` of blocks and the same blocks grouped under named slots.

The official Wan VAE keeps a decoder stage's residual blocks and its upsampler in one flat sequence
(``decoder.upsamples.{k}``: ``k`` counts every block of every stage); diffusers' ``AutoencoderKLWan``
groups them (``decoder.up_blocks.{g}.resnets.{j}``, ``decoder.up_blocks.{g}.upsamplers.0``). Which
flat index is which slot depends on the model's depth (residual blocks per stage, number of stages),
so no fixed rename table holds it; a :class:`SequenceRegroup` derives it from the keys themselves: a
member whose first child is a *closer* name (``resample``, ``time_conv``) ends its group. Diffusers'
own converter hard-codes the indices of the released depth; this works at any depth (a tiny test
model included).

:class:`RegroupTransform` runs the regrouping first and a :class:`~mm_checkpoint.key_maps.KeyMapTransform`
(the rest of the renames) after it, and inverts both for export. Template placeholders:

========  ===================================================================
``{k}``   the flat index (checkpoint side)
``{i}``   an outer index, copied (``encoder.downsamples.{i}.downsamples.{k}``)
``{g}``   the group number: how many closers come before the member
``{j}``   the member's position in its group
========  ===================================================================
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .errors import KeyMapError
from .key_maps import KeyMapTransform, KeyPlan

_PLACEHOLDER = re.compile(r"\{([kigj])\}")


def _regex(template: str) -> re.Pattern[str]:
    """``template`` (placeholders above) followed by ``.<child><rest>``, as a full-key regex."""
    parts = _PLACEHOLDER.split(template)
    body = "".join(re.escape(p) if n % 2 == 0 else rf"(?P<{p}>\d+)" for n, p in enumerate(parts))
    return re.compile(rf"^{body}\.(?P<child>[^.]+)(?P<rest>(?:\..*)?)$")


@dataclass(frozen=True)
class SequenceRegroup:
    """Flat members ``flat`` (checkpoint) <-> ``item`` / ``closer`` slots (model).

    A member is an item when its first child name is in ``item_children``, a closer when it is in
    ``closer_children``; other keys under ``flat`` are not this rule's. ``flat`` holds ``{k}`` (and
    optionally ``{i}``); ``item`` holds ``{j}`` and ``{g}`` or ``{i}``; ``closer`` the same without ``{j}``.
    """

    flat: str
    item: str
    closer: str
    item_children: tuple[str, ...]
    closer_children: tuple[str, ...]
    _compiled: tuple[Any, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if "{k}" not in self.flat or "{j}" not in self.item or "{j}" in self.closer:
            raise KeyMapError(f"{self}: flat needs {{k}}, item needs {{j}}, closer has no {{j}}")
        object.__setattr__(self, "_compiled", (_regex(self.flat), _regex(self.item), _regex(self.closer)))

    def _member(self, key: str) -> tuple[str, int, bool, str] | None:
        """``(outer index or "", k, is closer, ".child.rest")`` of a checkpoint key of this rule."""
        m = self._compiled[0].match(key)
        if m is None or m["child"] not in self.item_children + self.closer_children:
            return None
        return (
            m.groupdict().get("i") or "",
            int(m["k"]),
            m["child"] in self.closer_children,
            f".{m['child']}{m['rest']}",
        )

    def to_model(self, keys: Iterable[str]) -> dict[str, str]:
        """Checkpoint key -> model key for the keys of this rule."""
        members: dict[str, dict[int, bool]] = {}  # outer index -> {k: is closer}
        hits = {}
        for key in keys:
            hit = self._member(key)
            if hit is not None:
                hits[key] = hit
                by_k = members.setdefault(hit[0], {})
                by_k[hit[1]] = by_k.get(hit[1], False) or hit[2]
        slots: dict[tuple[str, int], str] = {}
        for outer, by_k in members.items():
            group = position = 0
            for k in sorted(by_k):
                names = {"i": outer, "g": str(group), "j": str(position)}
                template = self.closer if by_k[k] else self.item
                slots[outer, k] = _fill(template, names)
                if by_k[k]:
                    group, position = group + 1, 0
                else:
                    position += 1
        return {key: slots[outer, k] + rest for key, (outer, k, _, rest) in hits.items()}

    def to_checkpoint(self, keys: Iterable[str]) -> dict[str, str]:
        """Model key -> checkpoint key for the model keys of this rule (the inverse of :meth:`to_model`)."""
        item_re, closer_re = self._compiled[1], self._compiled[2]
        units: dict[str, set[tuple[int, int, int]]] = {}
        hits = {}
        for key in keys:
            for closer, regex in ((False, item_re), (True, closer_re)):
                m = regex.match(key)
                if m is None:
                    continue
                d = m.groupdict()
                outer, group = d.get("i") or "", int(d.get("g") or 0)
                unit = (group, 1 if closer else 0, 0 if closer else int(d["j"]))
                hits[key] = (outer, unit, f".{m['child']}{m['rest']}")
                units.setdefault(outer, set()).add(unit)
                break
        flat_index = {(o, u): k for o, us in units.items() for k, u in enumerate(sorted(us))}
        return {
            key: _fill(self.flat, {"i": o, "k": str(flat_index[o, u])}) + rest
            for key, (o, u, rest) in hits.items()
        }


def _fill(template: str, names: dict[str, str]) -> str:
    return _PLACEHOLDER.sub(lambda m: names[m.group(1)], template)


class RegroupTransform:
    """:class:`SequenceRegroup` rules applied first, then the rename table ``then`` (both inverted on
    export); keys no sequence rule claims go straight to ``then``."""

    def __init__(self, sequences: Iterable[SequenceRegroup], then: KeyMapTransform) -> None:
        self.sequences = tuple(sequences)
        self.then = then
        self.rules = (self.sequences, then.rules, then.passthrough)  # the key-map fingerprint reads it

    def __repr__(self) -> str:
        return f"RegroupTransform({len(self.sequences)} sequences, then {self.then!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RegroupTransform):
            return NotImplemented
        return (self.sequences, self.then) == (other.sequences, other.then)

    __hash__ = None  # type: ignore[assignment]

    def _renames(self, keys: list[str], forward: bool) -> dict[str, str]:
        renamed: dict[str, str] = {}
        for rule in self.sequences:
            todo = [k for k in keys if k not in renamed]
            renamed.update(rule.to_model(todo) if forward else rule.to_checkpoint(todo))
        return renamed

    def plan_load(self, checkpoint_keys: Iterable[str]) -> dict[str, KeyPlan]:
        """Plans keyed by model key: regroup, then the table."""
        keys = list(checkpoint_keys)
        middle = {k: k for k in keys} | self._renames(keys, forward=True)
        back = {m: k for k, m in middle.items()}
        if len(back) != len(middle):
            raise KeyMapError("two checkpoint keys regroup to one name")
        plans = self.then.plan_load(middle.values())
        return {t: KeyPlan(t, tuple(back[s] for s in p.sources), p.fn) for t, p in plans.items()}

    def plan_export(self, model_keys: Iterable[str]) -> dict[str, KeyPlan]:
        """Plans keyed by checkpoint key: the table inverted, then the regrouping inverted."""
        plans = self.then.plan_export(model_keys)
        renamed = self._renames(list(plans), forward=False)
        return {renamed.get(m, m): KeyPlan(renamed.get(m, m), p.sources, p.fn) for m, p in plans.items()}
