"""The registered names a config refers to (model, container and dataset ids, chat templates,
multimodal plugins, attention implementations), known to the check without importing torch.

A name is known when:

- a schema is registered for it (``register_model_schema`` / ``register_dataset_schema``: model and
  dataset ids);
- a torch-free module declares it (:func:`declare_ids`): mm-config's built-ins (the ``chatml`` template,
  the ``text`` plugin, transformers' attention implementations) and each plugin's ``mm_config.schemas``
  module for what its torch code registers (``wan2_2_container``, ``qwen2_vl``);
- a provider reports it (:func:`register_id_provider`): mm-trainer reports what its registries hold,
  so the modules imported from ``training.plugin`` count as soon as they are imported.

``mm-config check`` and the trainer's preflight validate with the context flag ``check_ids``: a name
none of these knows is an error naming the closest known one (:func:`registered_name`). Plain
``load_config`` (tests, tools) leaves names to the registries that build them. A kind nothing declares
at all is not checked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Literal

from pydantic import AfterValidator, ValidationInfo

from .errors import suggest
from .registry import registered_ids

IdKind = Literal["model", "container", "dataset", "template", "mm_plugin", "attn_implementation"]
ID_KINDS: tuple[str, ...] = IdKind.__args__  # type: ignore[attr-defined]

_PLUGINS = "the installed plugins' mm_config.schemas modules and the modules in training.plugin"
_SOURCES = {kind: _PLUGINS for kind in ("model", "container", "dataset", "template", "mm_plugin")} | {
    "attn_implementation": "transformers' implementations, or a Hub kernel `org/repo`"
}
_WHAT = {
    "model": "model id",
    "container": "container id",
    "dataset": "dataset id",
    "template": "chat template",
    "mm_plugin": "multimodal plugin",
    "attn_implementation": "attention implementation",
}
_DECLARED: dict[str, set[str]] = {kind: set() for kind in ID_KINDS}
_PROVIDERS: list[Callable[[str], Iterable[str]]] = []


def _kind(kind: str) -> str:
    if kind not in _DECLARED:
        raise ValueError(f"unknown id kind {kind!r}; expected one of {list(ID_KINDS)}")
    return kind


def declare_ids(kind: IdKind, *ids: str) -> None:
    """Make ``ids`` known names of ``kind`` (from a torch-free module, e.g. a plugin's schema module)."""
    _DECLARED[_kind(kind)].update(ids)


def undeclare_ids(kind: IdKind, *ids: str) -> None:
    """Forget declared ``ids`` of ``kind`` (for tests)."""
    _DECLARED[_kind(kind)].difference_update(ids)


def register_id_provider(provider: Callable[[str], Iterable[str]]) -> None:
    """Add ``provider(kind) -> names`` (e.g. mm-trainer's registries) to what :func:`known_ids` asks."""
    if provider not in _PROVIDERS:
        _PROVIDERS.append(provider)


def declared_ids(kind: IdKind) -> list[str]:
    """The names of ``kind`` known without any provider: declared, or with a registered schema."""
    names = set(_DECLARED[_kind(kind)])
    if kind in ("model", "dataset"):
        names.update(registered_ids(kind))  # type: ignore[arg-type]
    return sorted(names)


def known_ids(kind: IdKind) -> list[str]:
    """Every known name of ``kind``: :func:`declared_ids` and what the providers report."""
    names = set(declared_ids(kind))
    for provider in _PROVIDERS:
        names.update(provider(kind))
    return sorted(names)


def unknown_name(kind: IdKind, value: Any, context: Any, also: Iterable[str] = ()) -> str | None:
    """Why ``value`` is not a known name of ``kind`` (None when it is, or when names are not checked:
    the validation context has no ``check_ids``, or nothing declares this kind)."""
    if value is None or not (isinstance(context, dict) and context.get("check_ids")):
        return None
    known = known_ids(kind)
    if not known or value in known or value in also:
        return None
    hint = suggest(str(value), [*known, *also], _WHAT[kind])
    return f"unknown {_WHAT[kind]}; {hint} (known: {_SOURCES[kind]})"


def registered_name(
    kind: IdKind, *, also: Iterable[str] = (), accept: Callable[[str], bool] | None = None
) -> Any:
    """A pydantic validator (``Annotated[str, registered_name("template", also=("tokenizer",))]``) refusing
    a name of ``kind`` that is not known, when the validation context asks (``check_ids``); ``also`` are
    further valid names, ``accept`` a predicate for names that need no registration."""
    also = tuple(also)

    def check(value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, str) and accept is not None and accept(value):
            return value
        why = unknown_name(kind, value, info.context, also)
        if why:
            raise ValueError(why)
        return value

    return AfterValidator(check)


__all__ = [
    "ID_KINDS",
    "IdKind",
    "declare_ids",
    "declared_ids",
    "known_ids",
    "register_id_provider",
    "registered_name",
    "undeclare_ids",
    "unknown_name",
]
