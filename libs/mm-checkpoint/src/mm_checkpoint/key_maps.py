"""Table-driven, invertible key maps between a checkpoint's key namespace and a model's.

A :class:`KeyMapTransform` is an ordered table of rules; for each key the *first* matching rule
applies (so swaps such as ``norm2 <-> norm3`` are expressible), unmatched keys pass through. Rules:

* :class:`RenameRule` - regex rename with groups, optionally with a unary tensor op
  (:class:`Transpose`, :class:`Reshape`);
* :class:`ConcatRule` - several checkpoint tensors fused into one model tensor (inverse: split);
* :class:`SplitRule` - one checkpoint tensor split into several model tensors (inverse: concat).

Inverses are derived from the table: a pattern made of literal text and capturing groups (plus
``^``/``$`` anchors) inverts automatically; anything else needs an explicit inverse. This module
holds no model knowledge: the tables of the supported models ship as data (:mod:`.model_key_maps`),
other applications register theirs with :func:`.key_map_registry.register_weight_transform`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from .errors import KeyMapError

TensorFn = Callable[[list[torch.Tensor]], torch.Tensor]

# --------------------------------------------------------------------------- regex inversion


@dataclass(frozen=True)
class _Template:
    """A regex split into literal text and capturing groups: ``[str | (group_no, subpattern)]``."""

    parts: tuple[Any, ...]
    start: bool
    end: bool


def _find_group_end(body: str, i: int, pattern: str) -> int:
    depth, j, in_class = 0, i, False
    while j < len(body):
        c = body[j]
        if c == "\\":
            j += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
        elif c == "(":
            if depth > 0 and not body.startswith("(?", j):
                raise KeyMapError(
                    f"pattern {pattern!r}: nested capturing groups cannot be inverted automatically"
                )
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return j
        j += 1
    raise KeyMapError(f"pattern {pattern!r}: unbalanced parenthesis")


def _parse_pattern(pattern: str) -> _Template:
    start = pattern.startswith("^")
    end = pattern.endswith("$") and not pattern.endswith("\\$")
    body = pattern[int(start) : len(pattern) - int(end)]
    parts: list[Any] = []
    literal, i, group_no = "", 0, 0
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body) and not body[i + 1].isalnum():
            literal += body[i + 1]
            i += 2
        elif c == "(" and not body.startswith("(?", i):
            j = _find_group_end(body, i, pattern)
            if j + 1 < len(body) and body[j + 1] in "*+?{":
                raise KeyMapError(f"pattern {pattern!r}: a quantified group cannot be inverted automatically")
            group_no += 1
            parts += [literal, (group_no, body[i + 1 : j])] if literal else [(group_no, body[i + 1 : j])]
            literal, i = "", j + 1
        elif c in "\\.^$*+?{}[]|()":
            raise KeyMapError(
                f"pattern {pattern!r}: {c!r} outside a group makes it non-invertible; escape literal dots "
                f"(r'\\.') or give inverse_pattern/inverse_replacement explicitly"
            )
        else:
            literal += c
            i += 1
    if literal:
        parts.append(literal)
    return _Template(tuple(parts), start, end)


def _parse_replacement(replacement: str, pattern: str) -> list[Any]:
    """Split a ``re.sub`` template into literals and group numbers (``\\1`` or ``\\g<1>``)."""
    parts: list[Any] = []
    literal, i = "", 0
    while i < len(replacement):
        m = re.match(r"\\(\d+)|\\g<(\d+)>", replacement[i:])
        if m:
            if literal:
                parts.append(literal)
            parts.append(int(m.group(1) or m.group(2)))
            literal, i = "", i + m.end()
        elif replacement[i] == "\\" and i + 1 < len(replacement):
            literal += replacement[i + 1]
            i += 2
        else:
            literal += replacement[i]
            i += 1
    if literal:
        parts.append(literal)
    groups = [p for p in parts if isinstance(p, int)]
    if len(groups) != len(set(groups)):
        raise KeyMapError(
            f"replacement {replacement!r} of {pattern!r} uses a group twice; give an explicit inverse"
        )
    return parts


def invert_rename(pattern: str, replacement: str) -> tuple[str, str]:
    """Return ``(inverse_pattern, inverse_replacement)`` such that the inverse undoes ``re.sub(pattern, replacement)``.

    Raises:
        KeyMapError: the pattern has regex syntax outside groups, or drops a group.
    """
    tpl = _parse_pattern(pattern)
    subpatterns = {p[0]: p[1] for p in tpl.parts if isinstance(p, tuple)}
    repl = _parse_replacement(replacement, pattern)
    new_index: dict[int, int] = {}
    inv_pattern = "^" if tpl.start else ""
    for part in repl:
        if isinstance(part, int):
            if part not in subpatterns:
                raise KeyMapError(
                    f"replacement {replacement!r} refers to group {part} missing in {pattern!r}"
                )
            new_index[part] = len(new_index) + 1
            inv_pattern += f"({subpatterns[part]})"
        else:
            inv_pattern += re.escape(part)
    inv_pattern += "$" if tpl.end else ""
    dropped = sorted(set(subpatterns) - set(new_index))
    if dropped:
        raise KeyMapError(
            f"replacement {replacement!r} drops group(s) {dropped} of {pattern!r}: not invertible"
        )
    inv_repl = "".join(
        f"\\g<{new_index[p[0]]}>" if isinstance(p, tuple) else p.replace("\\", "\\\\") for p in tpl.parts
    )
    return inv_pattern, inv_repl


# --------------------------------------------------------------------------- tensor ops


@runtime_checkable
class TensorOp(Protocol):
    """A per-key tensor transform with its inverse."""

    def to_model(self, tensor: torch.Tensor) -> torch.Tensor: ...

    def from_model(self, tensor: torch.Tensor) -> torch.Tensor: ...


@dataclass(frozen=True)
class Transpose:
    """Swap two dims (its own inverse)."""

    dim0: int = 0
    dim1: int = 1

    def to_model(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.transpose(self.dim0, self.dim1).contiguous()

    def from_model(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.to_model(tensor)


@dataclass(frozen=True)
class Reshape:
    """Reshape between the checkpoint layout ``source_shape`` and the model layout ``model_shape`` (-1 allowed)."""

    model_shape: tuple[int, ...]
    source_shape: tuple[int, ...]

    def to_model(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.reshape(self.model_shape)

    def from_model(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.reshape(self.source_shape)


# --------------------------------------------------------------------------- rules


@dataclass(frozen=True)
class KeyPlan:
    """How to build one target tensor: from ``sources`` (keys on the other side) through ``fn``.

    ``fn=None`` means the single source tensor unchanged, which lets loaders read slices lazily.
    """

    target: str
    sources: tuple[str, ...]
    fn: TensorFn | None = None


@dataclass(frozen=True)
class RenameRule:
    """Rename checkpoint keys matching ``pattern`` (``re.sub`` once) to the model key ``replacement``.

    Example: ``RenameRule(r"^blocks\\.(\\d+)\\.attn1\\.to_q\\.", r"blocks.\\1.self_attn.q.")``.
    """

    pattern: str
    replacement: str
    op: TensorOp | None = None
    inverse_pattern: str | None = None
    inverse_replacement: str | None = None
    _compiled: tuple[re.Pattern, re.Pattern, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if (self.inverse_pattern is None) != (self.inverse_replacement is None):
            raise KeyMapError(
                f"rule {self.pattern!r}: give both inverse_pattern and inverse_replacement or neither"
            )
        if self.inverse_pattern is None:
            inv_p, inv_r = invert_rename(self.pattern, self.replacement)
        else:
            inv_p, inv_r = self.inverse_pattern, self.inverse_replacement  # type: ignore[assignment]
        object.__setattr__(self, "_compiled", (re.compile(self.pattern), re.compile(inv_p), inv_r))

    def forward_key(self, key: str) -> str | None:
        fwd = self._compiled[0]
        return fwd.sub(self.replacement, key, count=1) if fwd.search(key) else None

    def inverse_key(self, key: str) -> str | None:
        _, inv, inv_r = self._compiled
        return inv.sub(inv_r, key, count=1) if inv.search(key) else None


def _cat(dim: int) -> TensorFn:
    return lambda tensors: torch.cat(tensors, dim=dim)


def _piece(dim: int, index: int, count: int, sizes: Sequence[int] | None) -> TensorFn:
    def fn(tensors: list[torch.Tensor]) -> torch.Tensor:
        t = tensors[0]
        split = list(sizes) if sizes is not None else [t.shape[dim] // count] * count
        if sum(split) != t.shape[dim]:
            raise KeyMapError(f"cannot split dim {dim} of size {t.shape[dim]} into {split}")
        return t.narrow(dim, sum(split[:index]), split[index]).contiguous()

    return fn


def _strip_anchors(pattern: str) -> str:
    start = 1 if pattern.startswith("^") else 0
    end = len(pattern) - 1 if pattern.endswith("$") and not pattern.endswith("\\$") else len(pattern)
    return pattern[start:end]


@dataclass(frozen=True)
class _Fused:
    """Shared machinery of concat/split: ``parts`` (full-key regexes) <-> one ``fused`` key template."""

    parts: tuple[str, ...]
    fused: str
    dim: int
    sizes: tuple[int, ...] | None
    _compiled: tuple[Any, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        part_res = tuple(re.compile(_strip_anchors(p)) for p in self.parts)
        inverses = [invert_rename(p, self.fused) for p in self.parts]
        fused_re = re.compile(_strip_anchors(inverses[0][0]))
        object.__setattr__(self, "_compiled", (part_res, fused_re, tuple(r for _, r in inverses)))

    def fused_key(self, key: str) -> tuple[str, int] | None:
        """(fused key, part index) when ``key`` is one of the parts."""
        for i, part_re in enumerate(self._compiled[0]):
            m = part_re.fullmatch(key)
            if m:
                return m.expand(self.fused), i
        return None

    def part_keys(self, fused_key: str) -> list[str] | None:
        """The part keys that make up ``fused_key``, or None if it is not a fused key of this rule."""
        _, fused_re, templates = self._compiled
        m = fused_re.fullmatch(fused_key)
        return [m.expand(t) for t in templates] if m else None


@dataclass(frozen=True)
class ConcatRule(_Fused):
    """Checkpoint tensors matching ``parts`` (in order) are concatenated along ``dim`` into model key ``fused``.

    Example: ``ConcatRule((r"^(.*)\\.to_q\\.weight$", r"^(.*)\\.to_k\\.weight$"), r"\\1.qk.weight")``.
    Export splits it back (equal chunks unless ``sizes`` is given).
    """

    dim: int = 0
    sizes: tuple[int, ...] | None = None


@dataclass(frozen=True)
class SplitRule(_Fused):
    """One checkpoint tensor matching ``fused`` is split along ``dim`` into model keys ``parts``.

    Here ``parts`` are the model-side full-key regexes and ``fused`` the checkpoint key template;
    example: ``SplitRule((r"^(.*)\\.q\\.weight$", r"^(.*)\\.kv\\.weight$"), r"\\1.qkv.weight", sizes=(8, 16))``.
    """

    dim: int = 0
    sizes: tuple[int, ...] | None = None


Rule = RenameRule | ConcatRule | SplitRule


# --------------------------------------------------------------------------- transform


@runtime_checkable
class WeightTransform(Protocol):
    """What loaders and exporters need from a key map."""

    def plan_load(self, checkpoint_keys: Iterable[str]) -> dict[str, KeyPlan]: ...

    def plan_export(self, model_keys: Iterable[str]) -> dict[str, KeyPlan]: ...


class KeyMapTransform:
    """An ordered rule table mapping checkpoint keys to model keys and back (first matching rule wins)."""

    def __init__(self, rules: Sequence[Rule] = (), *, passthrough: bool = True) -> None:
        self.rules = tuple(rules)
        self.passthrough = passthrough

    def __repr__(self) -> str:
        return f"KeyMapTransform({len(self.rules)} rules, passthrough={self.passthrough})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, KeyMapTransform):
            return NotImplemented
        same = (self.rules, self.passthrough) == (other.rules, other.passthrough)
        return type(self) is type(other) and same

    __hash__ = None  # type: ignore[assignment]

    def forward(self, key: str) -> str:
        """Model key of checkpoint key ``key`` (for split keys use :meth:`plan_load`)."""
        for rule in self.rules:
            if isinstance(rule, RenameRule):
                out = rule.forward_key(key)
            elif isinstance(rule, ConcatRule):
                hit = rule.fused_key(key)
                out = hit[0] if hit else None
            else:
                if rule.part_keys(key) is not None:
                    raise KeyMapError(
                        f"checkpoint key {key!r} is split into several model keys; use plan_load"
                    )
                out = None
            if out is not None:
                return out
        return self._unmatched(key, "checkpoint")

    def inverse(self, key: str) -> str:
        """Checkpoint key of model key ``key``."""
        for rule in self.rules:
            if isinstance(rule, RenameRule):
                out = rule.inverse_key(key)
            elif isinstance(rule, SplitRule):
                hit = rule.fused_key(key)
                out = hit[0] if hit else None
            else:
                if rule.part_keys(key) is not None:
                    raise KeyMapError(
                        f"model key {key!r} is split into several checkpoint keys; use plan_export"
                    )
                out = None
            if out is not None:
                return out
        return self._unmatched(key, "model")

    def _unmatched(self, key: str, side: str) -> str:
        if not self.passthrough:
            raise KeyMapError(f"{side} key {key!r} matches no rule and passthrough is off")
        return key

    def plan_load(self, checkpoint_keys: Iterable[str]) -> dict[str, KeyPlan]:
        """Plans keyed by model key, built from checkpoint tensors."""
        return self._plan(list(checkpoint_keys), forward=True)

    def plan_export(self, model_keys: Iterable[str]) -> dict[str, KeyPlan]:
        """Plans keyed by checkpoint key, built from model tensors."""
        return self._plan(list(model_keys), forward=False)

    def _plan(self, keys: list[str], forward: bool) -> dict[str, KeyPlan]:
        plans: dict[str, KeyPlan] = {}
        fused: dict[str, dict[int, str]] = {}
        fused_rule: dict[str, _Fused] = {}
        for key in keys:
            plan = self._plan_one(key, forward, fused, fused_rule)
            if plan is not None:
                _add_plan(plans, plan)
        for target, pieces in fused.items():
            rule = fused_rule[target]
            expected = rule.part_keys(target) or []
            missing = [k for i, k in enumerate(expected) if i not in pieces]
            if missing:
                raise KeyMapError(f"cannot build {target!r}: missing part(s) {missing}")
            _add_plan(plans, KeyPlan(target, tuple(pieces[i] for i in range(len(expected))), _cat(rule.dim)))
        return plans

    def _plan_one(
        self, key: str, forward: bool, fused: dict, fused_rule: dict
    ) -> KeyPlan | _SplitPlans | None:
        join_cls, split_cls = (ConcatRule, SplitRule) if forward else (SplitRule, ConcatRule)
        for rule in self.rules:
            if isinstance(rule, RenameRule):
                out = rule.forward_key(key) if forward else rule.inverse_key(key)
                if out is not None:
                    op = rule.op
                    fn = None if op is None else _unary(op.to_model if forward else op.from_model)
                    return KeyPlan(out, (key,), fn)
            elif isinstance(rule, join_cls):
                hit = rule.fused_key(key)
                if hit is not None:
                    fused.setdefault(hit[0], {})[hit[1]] = key
                    fused_rule[hit[0]] = rule
                    return None
            elif isinstance(rule, split_cls):
                parts = rule.part_keys(key)
                if parts is not None:
                    return _SplitPlans(key, parts, rule)
        self._unmatched(key, "checkpoint" if forward else "model")
        return KeyPlan(key, (key,))

    def check_roundtrip(self, checkpoint_keys: Iterable[str]) -> None:
        """Raise :class:`KeyMapError` listing checkpoint keys that do not survive load-then-export mapping."""
        keys = list(checkpoint_keys)
        model_keys = list(self.plan_load(keys))
        back = set(self.plan_export(model_keys))
        lost, extra = sorted(set(keys) - back), sorted(back - set(keys))
        if lost or extra:
            raise KeyMapError(
                f"key map is not invertible on these keys: lost {lost[:10]}, produced {extra[:10]}"
            )

    def to_model(self, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Apply the table to a whole checkpoint state dict."""
        return _apply(self.plan_load(state_dict), state_dict)

    def from_model(self, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Invert the table on a whole model state dict."""
        return _apply(self.plan_export(state_dict), state_dict)


class _SplitPlans(list):
    """Marker: several plans produced by one split."""

    def __init__(self, source: str, targets: list[str], rule: _Fused) -> None:
        n = len(targets)
        super().__init__(
            KeyPlan(t, (source,), _piece(rule.dim, i, n, rule.sizes)) for i, t in enumerate(targets)
        )


def _unary(fn: Callable[[torch.Tensor], torch.Tensor]) -> TensorFn:
    return lambda tensors: fn(tensors[0])


def _add_plan(plans: dict[str, KeyPlan], plan: KeyPlan | _SplitPlans) -> None:
    for p in plan if isinstance(plan, _SplitPlans) else [plan]:
        if p.target in plans:
            raise KeyMapError(f"keys {plans[p.target].sources} and {p.sources} both map to {p.target!r}")
        plans[p.target] = p


def _apply(plans: dict[str, KeyPlan], tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: apply_plan(p, [tensors[s] for s in p.sources]) for k, p in plans.items()}


def apply_plan(plan: KeyPlan, tensors: list[torch.Tensor]) -> torch.Tensor:
    """Build the target tensor of ``plan`` from its source tensors."""
    return tensors[0] if plan.fn is None else plan.fn(tensors)


def planned_shape_dtype(
    plan: KeyPlan, sources: Sequence[tuple[Sequence[int], torch.dtype]]
) -> tuple[tuple[int, ...], torch.dtype]:
    """Shape and dtype of ``plan``'s target from its sources' (shape, dtype), reading no data
    (``fn`` runs on meta tensors)."""
    if plan.fn is None:
        shape, dtype = sources[0]
        return tuple(shape), dtype
    out = plan.fn([torch.empty(tuple(shape), dtype=dtype, device="meta") for shape, dtype in sources])
    return tuple(out.shape), out.dtype


IDENTITY = KeyMapTransform(())
"""The transform used when no ``model_type`` is given."""
