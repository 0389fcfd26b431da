"""The error report: every problem of a config, each with its YAML path, bad value and expectation."""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

Loc = tuple[str | int, ...]


class _NoValue:
    def __repr__(self) -> str:
        return "<no value>"


NO_VALUE: Any = _NoValue()


def format_loc(loc: Iterable[str | int]) -> str:
    """Render a location tuple as a YAML path: ``("a", "b", 2)`` -> ``a.b[2]``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "<root>"


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a config: where (``loc``), what was expected (``message``), what was found."""

    loc: Loc
    message: str
    value: Any = NO_VALUE
    deps: tuple[Loc, ...] = field(default=(), compare=False)
    """Other locations the check read (a rule's inputs); used to drop consequences of earlier errors."""
    rule: bool = field(default=False, compare=False)
    """True for violations of a validation rule (as opposed to a field's type or value)."""

    @property
    def path(self) -> str:
        """The YAML path, e.g. ``parallel.fsdp_plan.apply_modules[2]``."""
        return format_loc(self.loc)

    def prefixed(self, prefix: Loc) -> Problem:
        """The same problem located under ``prefix``."""
        prefix = tuple(prefix)
        deps = tuple(prefix + tuple(d) for d in self.deps)
        return replace(self, loc=prefix + tuple(self.loc), deps=deps)

    def reads(self) -> tuple[Loc, ...]:
        """Every location this problem depends on: its own and its ``deps``."""
        return (tuple(self.loc), *self.deps)

    def __str__(self) -> str:
        shown = "" if self.value is NO_VALUE else f" = {_short_repr(self.value)}"
        return f"{self.path}{shown}: {self.message}" if self.loc else f"{self.message}{shown}"


class RuleViolations(ValueError):
    """Raised by validators to report several problems at once; paths are relative to the validated model.

    ``rule`` marks every problem as a rule violation (True) or a field error (False); None keeps
    each problem's own mark (a plugin schema's report holds both).
    """

    def __init__(self, problems: Sequence[Problem], rule: bool | None = True) -> None:
        self.problems = [p if rule is None else replace(p, rule=rule) for p in problems]
        super().__init__("; ".join(str(p) for p in self.problems))


class MissingDependencyError(ImportError):
    """An optional package that a config setting or a command needs is not installed. The message names
    what needs it and how to install it (``pip install 'mm-trainer[lora]'``); console scripts end with
    their "dependency" exit code (69) and this message, without a traceback."""


class ConfigError(ValueError):
    """An invalid config. ``problems`` lists every problem found; ``str()`` is the full report."""

    def __init__(self, problems: Sequence[Problem], source: str | None = None) -> None:
        self.problems = list(problems)
        self.source = source
        n = len(self.problems)
        head = f"{source}: " if source else ""
        lines = [f"{head}{n} problem{'s' if n != 1 else ''} in the config:"]
        lines += [f"  - {p}" for p in self.problems]
        super().__init__("\n".join(lines))

    @property
    def paths(self) -> list[str]:
        """YAML paths of all problems, in report order."""
        return [p.path for p in self.problems]


def suggest(name: str, candidates: Iterable[str], what: str = "key") -> str:
    """A hint naming the closest candidate (``did you mean `x`?``) or listing the valid ones."""
    candidates = sorted(candidates)
    close = difflib.get_close_matches(str(name), candidates, n=1, cutoff=0.6)
    if close:
        return f"did you mean `{close[0]}`?"
    if not candidates:
        return f"no {what}s are allowed here"
    return f"expected one of: {', '.join(candidates)}"


RENAMED_KEYS: dict[str, str] = {
    "dcp_cache_dir": "checkpoint_conversion_dir",
    "dcp_conversion_dir": "checkpoint_conversion_dir",
    "data_parallel_size": "replicate_parallel_size",
    "condition_mbs": "condition_micro_steps",
}
"""Config keys that were renamed -> their new name; an old key is refused with a message naming the new one."""


def _renamed(name: str, allowed: Iterable[str]) -> str | None:
    new = RENAMED_KEYS.get(name)
    return f"renamed: use `{new}`" if new in allowed else None


def _removed(schema: type[BaseModel], loc: Loc, name: str) -> str | None:
    """The reason a schema gives for a key it dropped: its ``removed_keys`` class attribute (key ->
    where the setting went), read like :data:`RENAMED_KEYS`."""
    model = _model_at(schema, loc)
    why = (getattr(model, "removed_keys", None) or {}).get(name) if model is not None else None
    return f"removed: {why}" if why else None


def problems_from_validation_error(err: ValidationError, schema: type[BaseModel]) -> list[Problem]:
    """Translate pydantic's errors into :class:`Problem` s with YAML paths and suggestions."""
    problems: list[Problem] = []
    for e in err.errors(include_url=False):
        loc = tuple(e["loc"])
        inner = (e.get("ctx") or {}).get("error")
        if e["type"] == "value_error" and isinstance(inner, RuleViolations):
            problems += [p.prefixed(loc) for p in inner.problems]
        elif e["type"] == "extra_forbidden":
            names, name = field_names_at(schema, loc[:-1]), str(loc[-1])
            hint = _removed(schema, loc[:-1], name) or _renamed(name, names) or suggest(name, names)
            problems.append(Problem(loc, f"unknown key; {hint}"))
        else:
            value = NO_VALUE if e["type"] == "missing" else e.get("input", NO_VALUE)
            problems.append(Problem(loc, _expectation(e["msg"]), value))
    return problems


def field_names_at(schema: type[BaseModel], loc: Loc) -> list[str]:
    """Names of the keys the schema allows at ``loc`` (empty if ``loc`` is not a schema model)."""
    model = _model_at(schema, loc)
    return list(model.model_fields) if model is not None else []


def _model_at(schema: type[BaseModel], loc: Loc) -> type[BaseModel] | None:
    tp: Any = schema
    for part in loc:
        tp = _step(_strip(tp), part)
        if tp is None:
            return None
    model = _strip(tp)
    return model if _is_model(model) else None


def _step(tp: Any, part: str | int) -> Any:
    if _is_model(tp):
        field = tp.model_fields.get(part) if isinstance(part, str) else None
        return field.annotation if field else None
    origin, args = get_origin(tp), get_args(tp)
    if origin in (dict, Mapping) and len(args) == 2:
        return args[1]
    if origin in (list, tuple, Sequence) and args:
        return args[0]
    return None


def _strip(tp: Any) -> Any:
    while True:
        origin = get_origin(tp)
        if origin is typing.Annotated:
            tp = get_args(tp)[0]
        elif origin in (Union, types.UnionType):
            options = [a for a in get_args(tp) if a is not type(None)]
            models = [a for a in options if _is_model(_strip(a))]
            tp = models[0] if models else (options[0] if len(options) == 1 else None)
        else:
            return tp


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _expectation(msg: str) -> str:
    msg = msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    if msg.startswith("Input should be "):
        msg = "expected " + msg.removeprefix("Input should be ")
    return msg


def _short_repr(value: Any, limit: int = 80, text_limit: int = 400) -> str:
    """``repr(value)`` cut to ``limit`` characters; a string (a path the user must find) to ``text_limit``."""
    text = repr(value)
    cut = text_limit if isinstance(value, str) else limit
    return text if len(text) <= cut else text[: cut - 3] + "..."
