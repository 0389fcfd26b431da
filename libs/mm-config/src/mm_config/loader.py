"""Read YAML, apply dotted overrides, validate with one complete error report, dump the result."""

from __future__ import annotations

import copy
import importlib
import os
import re
from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from .errors import ConfigError, Loc, Problem, format_loc, problems_from_validation_error
from .model import _SINGLE_KEYS
from .registry import load_schema_entry_points
from .root import TrainConfig, context_ranks_per_node, context_world_size


class _Loader(yaml.SafeLoader):
    """SafeLoader that reads ``1e-5`` as a float (YAML 1.2) and rejects duplicate keys."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (the second would silently win)", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)

_KEY_PART = re.compile(r"^([^\[\]]*)((?:\[-?\d+\])*)$")


def parse_yaml_value(text: str) -> Any:
    """Type an override value like YAML does: ``3``, ``1e-5``, ``true``, ``null``, ``[1, 2]``, ``abc``."""
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader


def parse_override(text: str) -> tuple[list[str | int], Any]:
    """Split ``a.b[2].c=value`` into its key path (``["a", "b", 2, "c"]``) and typed value."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"override {text!r}: expected KEY.PATH=VALUE")
    path: list[str | int] = []
    for part in key.strip().split("."):
        m = _KEY_PART.match(part)
        if not m or not m.group(1) and not m.group(2):
            raise ValueError(f"override {text!r}: bad key segment {part!r}")
        if m.group(1):
            path.append(int(m.group(1)) if m.group(1).lstrip("-").isdigit() else m.group(1))
        path += [int(i) for i in re.findall(r"-?\d+", m.group(2))]
    return path, parse_yaml_value(raw)


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Return a copy of ``data`` with every ``a.b.c=value`` override applied (dict keys and list indices)."""
    data = copy.deepcopy(data)
    problems = []
    for text in overrides:
        try:
            path, value = parse_override(text)
            _set_path(data, path, value)
        except (ValueError, yaml.YAMLError) as exc:
            problems.append(Problem(("<override>",), str(exc).replace("\n", " "), text))
    if problems:
        raise ConfigError(problems, "overrides")
    return data


def _set_path(data: dict[str, Any], path: list[str | int], value: Any) -> None:
    node: Any = data
    for i, part in enumerate(path):
        last = i == len(path) - 1
        where = format_loc(path[: i + 1])
        if isinstance(node, list):
            if not isinstance(part, int) or not -len(node) <= part < len(node):
                raise ValueError(f"{where}: index out of range for a list of {len(node)} items")
        elif isinstance(node, dict):
            part = str(part)
            if not last and node.get(part) is None:
                node[part] = {}
        else:
            raise ValueError(f"{format_loc(path[:i]) or '<root>'} is {node!r}, not a mapping or list")
        if last:
            node[part] = value
        else:
            node = node[part]


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping; an empty file is ``{}``. Errors name the file and line."""
    path = Path(path)
    try:
        with path.open() as stream:  # a stream, so YAML error marks name the file
            data = yaml.load(stream, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader
    except OSError as exc:
        raise ConfigError(
            [Problem((), f"cannot read config file: {exc.strerror or exc}")], str(path)
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError([Problem((), f"invalid YAML: {exc}")], str(path)) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError([Problem((), "expected a mapping of sections at the top level", data)], str(path))
    return data


def load_plugins(data: dict[str, Any]) -> list[Problem]:
    """Import the installed schema entry points and the ``training.plugin`` modules of ``data``."""
    return load_schema_entry_points() + import_plugins(data)


def import_plugins(data: dict[str, Any]) -> list[Problem]:
    """Import the modules in ``training.plugin`` of raw config data so their schemas register."""
    training = data.get("training") if isinstance(data, dict) else None
    plugins = training.get("plugin") if isinstance(training, dict) else None
    if not isinstance(plugins, list):
        return []
    problems = []
    for i, name in enumerate(plugins):
        if not isinstance(name, str):
            continue  # a type error, reported by validation
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - any import failure is a config problem
            problems.append(Problem(("training", "plugin", i), f"cannot import plugin module: {exc}", name))
    return problems


def validate_config(
    data: dict[str, Any],
    world_size: int | None = None,
    source: str | None = None,
    *,
    check_paths: bool = False,
    ranks_per_node: int | None = None,
    check_ids: bool = False,
) -> TrainConfig:
    """Validate raw config data for ``world_size`` (None: ``$WORLD_SIZE`` or 1); raise one :class:`ConfigError`.

    ``ranks_per_node`` (None: ``$LOCAL_WORLD_SIZE`` under a launcher of this world size, else all on
    one node) resolves ``parallel.replicate_parallel_size: auto`` (one HSDP replica per node).

    With ``check_paths`` every path the run reads (``from_pretrained``, ``checkpoint_path``,
    ``data.data_path``, ``data.data_root``, ``training.load`` and the paths plugin schemas declare as
    :data:`~mm_config.base.InputPath`) must exist; with ``check_ids`` every registered name the config
    uses (model, container and dataset ids, templates, plugins, attention implementations) must be
    known (:mod:`mm_config.known_ids`). Field errors are reported first. To report rule
    violations in the same pass, offending keys are dropped (falling back to defaults) and
    validation repeats; a rule that read a dropped key is left out, since it would only echo the
    first error.
    """
    world = context_world_size({"world_size": world_size})
    per_node = context_ranks_per_node({"ranks_per_node": ranks_per_node}, world)
    context = {
        "world_size": world,
        "ranks_per_node": per_node,
        "check_paths": check_paths,
        "check_ids": check_ids,
    }
    try:
        return TrainConfig.model_validate(data, context=context)
    except ValidationError as err:
        report = problems_from_validation_error(err, TrainConfig)
    current, pruned, work = list(report), [], copy.deepcopy(data)
    for _ in range(4):
        newly = [p.loc for p in current if _prune(work, p.loc)]
        if not newly:
            break
        pruned += newly
        try:
            TrainConfig.model_validate(work, context=context)
            break
        except ValidationError as err:
            current = problems_from_validation_error(err, TrainConfig)
        report += [p for p in current if p.rule and p not in report and not _touches(p, pruned)]
    sections = list(TrainConfig.model_fields)
    report.sort(key=lambda p: sections.index(p.loc[0]) if p.loc and p.loc[0] in sections else -1)
    raise ConfigError(report, source)


def _touches(problem: Problem, pruned: list[Loc]) -> bool:
    return any(a[: len(b)] == b or b[: len(a)] == a for a in problem.reads() for b in map(tuple, pruned))


def prune_problems(data: dict[str, Any], locs: Sequence[Loc]) -> dict[str, Any]:
    """A copy of ``data`` without the values at ``locs`` (a whole list where a loc points into one), so
    that what reads the rest meets only values no check refused."""
    data = copy.deepcopy(data)
    for loc in locs:
        _prune(data, loc)
    return data


def _prune(data: Any, loc: Loc) -> bool:
    """Delete the value at ``loc`` (a whole list when ``loc`` points into one); True if something went."""
    node = data
    for i, part in enumerate(loc):
        if not isinstance(node, dict) or part not in node:
            return False
        if i == len(loc) - 1 or isinstance(node[part], list) or not isinstance(node[part], dict):
            del node[part]
            return True
        node = node[part]
    return False


def load_config(
    path: str | Path,
    overrides: Sequence[str] | None = None,
    world_size: int | None = None,
    *,
    plugins: bool = True,
    check_paths: bool = False,
    ranks_per_node: int | None = None,
) -> TrainConfig:
    """Load a YAML config, apply ``overrides`` (``["training.lr=1e-5", ...]``) and validate it.

    An empty file is refused. With ``plugins`` the installed ``mm_config.schemas`` entry points and
    the modules in ``training.plugin`` are imported first so that the schemas they register validate
    their keys in the same pass. ``check_paths``: see :func:`validate_config`. Raises
    :class:`ConfigError` listing every problem.
    """
    raw = read_yaml(path)
    if not raw:
        empty = Problem((), "the config file is empty (or only comments): nothing to run")
        raise ConfigError([empty], str(path))
    data = apply_overrides(raw, overrides or [])
    return validate_with_plugins(
        data, world_size, str(path), plugins=plugins, check_paths=check_paths, ranks_per_node=ranks_per_node
    )


def validate_with_plugins(
    data: dict[str, Any],
    world_size: int | None = None,
    source: str | None = None,
    *,
    plugins: bool = True,
    check_paths: bool = False,
    ranks_per_node: int | None = None,
) -> TrainConfig:
    """:func:`load_plugins` (unless ``plugins`` is False), then :func:`validate_config`; one report."""
    plugin_problems = load_plugins(data) if plugins else []
    try:
        cfg = validate_config(
            data, world_size, source=source, check_paths=check_paths, ranks_per_node=ranks_per_node
        )
    except ConfigError as err:
        raise ConfigError(plugin_problems + err.problems, source) from None
    if plugin_problems:
        raise ConfigError(plugin_problems, source)
    return cfg


def config_to_data(cfg: TrainConfig) -> dict[str, Any]:
    """The resolved config as plain data that validates back to ``cfg`` (at its world size)."""
    data = cfg.model_dump(mode="json")
    if cfg.model.is_container:  # the single-model keys are all default there; leave them out
        data["model"] = {k: v for k, v in data["model"].items() if k not in _SINGLE_KEYS}
    return data


def config_to_yaml(cfg: TrainConfig) -> str:
    """The resolved config as YAML text (every key, defaults included)."""
    header = (
        f"# Resolved by mm-config {version('mm-config')} for world size {cfg.parallel.world_size}; "
        "load it with mm_config.load_config.\n"
    )
    return header + yaml.safe_dump(config_to_data(cfg), sort_keys=False, allow_unicode=True)


def dump_config(cfg: TrainConfig, path: str | Path) -> Path:
    """Write the resolved config as YAML to ``path`` (parents created); return the path.

    Atomic: the text goes to a temporary file beside ``path``, flushed to disk, then renamed over it, so
    a process killed mid-write leaves the previous file whole (a run resumed after a SIGKILL compares its
    settings with this file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # one writer per process; default permissions
    try:
        with open(tmp, "w") as f:
            f.write(config_to_yaml(cfg))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


__all__ = [
    "apply_overrides",
    "config_to_data",
    "config_to_yaml",
    "dump_config",
    "import_plugins",
    "load_config",
    "load_plugins",
    "parse_override",
    "parse_yaml_value",
    "prune_problems",
    "read_yaml",
    "validate_config",
    "validate_with_plugins",
]
