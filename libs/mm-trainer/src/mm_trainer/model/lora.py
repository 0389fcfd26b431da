"""LoRA adapters (peft) on sub-models, placed in the build order after the model and before CP / features / FSDP.

:func:`inject_lora` wraps every ``nn.Linear`` that ``model.models.<name>.lora.target_modules`` matches
(plan pattern syntax, paths inside the sub-model) in a peft ``lora.Linear``: the layer itself moves to
``<path>.base_layer`` and two small layers ``<path>.lora_A.default`` (A: r x in) and
``<path>.lora_B.default`` (B: out x r) join it, so that the layer computes
``W x + b + (alpha / r) * B (A x)``. Only A and B train.

Why this place in the build order: the FSDP unit that wraps a block then also owns that block's adapters
(one all-gather / reduce-scatter per unit, as without LoRA, and the optimizer sees DTensor shards of the
adapters only); recompute / offload wrappers sit outside the whole block; context parallelism is
unaffected because an adapter acts token by token, exactly like the layer it wraps.

What follows for the rest of the build:

- loading the *base* weights (``setup_weights``, after sharding) must see the module's own key names
  (``blocks.0.self_attn.q.weight``, not ``...q.base_layer.weight``) and no adapters:
  :meth:`LoraAdapters.base_names` presents the state dict that way while the pretrained weights load;
- checkpoints hold the adapters only (:attr:`ModelContainer.partial_checkpoints`): on resume the base
  reloads from its pretrained source, then the checkpoint restores adapters and optimizer state;
- adapters are initialized after the base has loaded (:meth:`LoraAdapters.init_adapters`): A as peft
  does (Kaiming-uniform, a = sqrt(5)), B = 0, so training starts exactly at the base model. Each draw
  is keyed by (seed, sub-model, module path) and every rank copies its shard out of the same full
  tensor, so the start does not depend on the layout.

Dropout inside the adapters is refused by the config (``LoraConfig.dropout``): its mask would be drawn
per rank on the rank's sequence shard under Ulysses / Ring.
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from mm_checkpoint.module_state import assign_local, local_index
from mm_config import MissingDependencyError
from mm_parallel import match_modules
from torch import nn

ADAPTER_NAME = "default"
"""peft's adapter name; it appears in module paths (``lora_A.default``) but in no exported file."""
_BASE = ".base_layer."
_ADAPTER_PARTS = (".lora_A.", ".lora_B.")


@dataclass(frozen=True)
class LoraTargets:
    """The adapted layers of one sub-model and the section that asked for them."""

    where: str
    """YAML path of the section (``model.models.predictor.lora``)."""
    rank: int
    alpha: float
    paths: tuple[str, ...]
    """Module paths inside the sub-model of every wrapped ``nn.Linear``, in module order."""
    init_from: str | None = None
    """A LoRA file the adapters start from (``LoraConfig.init_from``); None: A random, B = 0."""

    @property
    def scale(self) -> float:
        """``alpha / rank``: the factor on the adapter's output."""
        return self.alpha / self.rank


def require_peft(where: str) -> Any:
    """The ``peft`` module, or a :class:`~mm_config.MissingDependencyError` naming the config key and
    the extra that installs it."""
    try:
        import peft
    except ImportError as exc:
        raise MissingDependencyError(
            f"{where}: LoRA is trained through peft, which is not installed; "
            "install it with `pip install 'mm-trainer[lora]'` (or `pip install peft`)"
        ) from exc
    return peft


def lora_target_paths(module: nn.Module, patterns: list[str], *, where: str) -> tuple[str, ...]:
    """Module paths (inside ``module``) of the ``nn.Linear`` layers ``patterns`` match.

    Raises:
        PatternMatchError: a pattern matches no module (the message names the closest paths).
        ValueError: a pattern matches a module that is not an ``nn.Linear``.
    """
    matched = match_modules(module, patterns, what=f"{where}.target_modules")
    paths: list[str] = []
    for pattern, found in matched.items():
        for path in found:
            layer = module.get_submodule(path)
            if type(layer) is not nn.Linear:
                raise ValueError(
                    f"{where}.target_modules: pattern {pattern!r} matches {path!r}, a "
                    f"{type(layer).__name__}; LoRA adapts nn.Linear layers only"
                )
            if path not in paths:
                paths.append(path)
    order = {name: i for i, (name, _) in enumerate(module.named_modules())}
    return tuple(sorted(paths, key=order.__getitem__))


def inject_lora_layers(module: nn.Module, targets: LoraTargets) -> None:
    """Wrap ``targets.paths`` of ``module`` in peft LoRA layers; everything else in ``module`` is frozen.

    Works on a meta-built module (the adapters are created on meta too and materialized with it). The
    adapters are fp32 whatever the base's dtype: a bf16 base (the sub-model's ``dtype``) stays bf16 and
    frozen while the trained weights keep full precision (FSDP's ``param_dtype`` sets the compute dtype).
    """
    peft = require_peft(targets.where)
    config = peft.LoraConfig(
        r=targets.rank,
        lora_alpha=targets.alpha,
        lora_dropout=0.0,
        bias="none",
        # One full-match regex of the exact paths: peft's list form also matches path suffixes.
        target_modules="|".join(re.escape(p) for p in targets.paths),
    )
    meta = any(p.is_meta for p in module.parameters())
    peft.inject_adapter_in_model(config, module, adapter_name=ADAPTER_NAME, low_cpu_mem_usage=meta)
    from peft.functional import cast_adapter_dtype

    cast_adapter_dtype(module, ADAPTER_NAME, autocast_adapter_dtype=True)
    for name, param in module.named_parameters():
        param.requires_grad_(is_adapter_key(name))


def is_adapter_key(key: str) -> bool:
    """Whether a parameter / state-dict key belongs to a LoRA adapter (``...lora_A.default.weight``)."""
    return any(part in f".{key}" for part in _ADAPTER_PARTS)


def adapter_keys(module: nn.Module) -> frozenset[str]:
    """State-dict keys of ``module``'s LoRA adapters."""
    return frozenset(k for k in module.state_dict(keep_vars=True) if is_adapter_key(k))


class LoraAdapters:
    """The LoRA adapters injected into a container's sub-models (empty when no sub-model has ``lora``)."""

    def __init__(self, targets: Mapping[str, LoraTargets]) -> None:
        self.targets = dict(targets)

    def __bool__(self) -> bool:
        return bool(self.targets)

    @contextmanager
    def base_names(self, name: str, module: nn.Module) -> Iterator[None]:
        """While inside, ``module.state_dict()`` holds the wrapped layers under their own names
        (``...q.weight``) and no adapters: the view pretrained weights load into (and convert through)."""
        targets = self.targets.get(name)
        if targets is None:
            yield
            return
        heads = frozenset(f"{p}." for p in targets.paths)

        def to_base_names(_module: nn.Module, state: dict, prefix: str, _meta: Any) -> None:
            items = list(state.items())
            state.clear()
            for key, value in items:
                base = _base_key(key, prefix, heads) if key.startswith(prefix) else key
                if base is not None:
                    state[base] = value

        handle = module.register_state_dict_post_hook(to_base_names)
        try:
            yield
        finally:
            handle.remove()

    @torch.no_grad()
    def init_adapters(self, model: nn.Module, seed: int) -> None:
        """A ~ Kaiming-uniform(a=sqrt(5)) keyed by (seed, sub-model, path), B = 0, on plain or sharded params;
        a section with ``init_from``: the file's adapters (:func:`load_lora_file`)."""
        for name, targets in self.targets.items():
            sub = getattr(model, name)
            if targets.init_from is not None:
                load_lora_file(sub, targets)
                continue
            for path in targets.paths:
                layer = sub.get_submodule(path)
                down = layer.lora_A[ADAPTER_NAME].weight
                up = layer.lora_B[ADAPTER_NAME].weight
                generator = torch.Generator().manual_seed(zlib.crc32(f"{seed}:{name}.{path}".encode()))
                full = torch.empty(tuple(down.shape), dtype=torch.float32)
                nn.init.kaiming_uniform_(full, a=math.sqrt(5), generator=generator)
                _assign_full(down, full)
                _assign_full(up, torch.zeros(tuple(up.shape)))

    def summary(self, model: nn.Module) -> list[str]:
        """One line per adapted sub-model: layers, rank, alpha, trainable and frozen element counts."""
        lines = []
        for name, t in self.targets.items():
            params = list(getattr(model, name).named_parameters())
            train = sum(p.numel() for k, p in params if is_adapter_key(k))
            frozen = sum(p.numel() for k, p in params if not is_adapter_key(k))
            lines.append(
                f"{t.where}: {len(t.paths)} layers, rank {t.rank}, alpha {t.alpha:g}: "
                f"{train:,} trainable parameters, {frozen:,} frozen"
            )
        return lines


class LoraFileError(ValueError):
    """A LoRA file (``lora.init_from``) whose adapters do not fit the sub-model's adapted layers: exit 66."""

    raised_on_every_rank = True  # every rank reads the same file: rank 0 alone prints it


AdapterShapes = Mapping[str, tuple[tuple[int, ...], tuple[int, ...]]]
"""``{module path: (A's shape, B's shape)}`` of a LoRA file's adapters."""


def check_lora_file(module: nn.Module, targets: LoraTargets) -> None:
    """Refuse ``targets.init_from`` when its adapters do not fit the adapted layers of ``module`` (which may
    be on meta), from the file's safetensors header alone (``mm_checkpoint.read_lora_file_shapes``): no
    tensor of the file is read, and no weight of the model needs to be.

    Raises:
        LoraFileError: as :func:`load_lora_file` (the same message).
        mm_checkpoint.CheckpointFormatError: the file is no LoRA file (a key of no LoRA layout, an A
            without its B).
    """
    from mm_checkpoint import read_lora_file_shapes

    model_type = getattr(module, "weight_transform_model_type", None)
    _refuse_misfit(module, targets, read_lora_file_shapes(str(targets.init_from), model_type=model_type))


def _refuse_misfit(module: nn.Module, targets: LoraTargets, shapes: AdapterShapes) -> None:
    """Raise :class:`LoraFileError` naming the file, the first mismatching layers and what ``module`` is
    (its ``architecture_name`` when it has one, e.g. an LTX-2 release) unless ``shapes`` are exactly the
    adapters ``targets`` put into ``module``."""
    problems = [f"{p}: no such adapted layer here" for p in sorted(set(shapes) - set(targets.paths))]
    problems += [f"{p}: adapted here, not in the file" for p in targets.paths if p not in shapes]
    for p in targets.paths:
        layer = module.get_submodule(p)
        want = (
            tuple(layer.lora_A[ADAPTER_NAME].weight.shape),
            tuple(layer.lora_B[ADAPTER_NAME].weight.shape),
        )
        if p in shapes and tuple(map(tuple, shapes[p])) != want:
            problems.append(f"{p}: A, B of shapes {tuple(map(tuple, shapes[p]))} in the file, {want} here")
    if problems:
        what = getattr(module, "architecture_name", None) or type(module).__name__
        raise LoraFileError(
            f"{targets.where}.init_from={targets.init_from}: its adapters do not fit this {what} "
            f"({len(problems)} mismatching layers; the first: {'; '.join(problems[:5])}): a LoRA of another "
            "model or release, or other target_modules / rank"
        )


@torch.no_grad()
def load_lora_file(module: nn.Module, targets: LoraTargets) -> None:
    """Set the adapters of ``module`` (plain or sharded) to those of ``targets.init_from``, read through the
    module's key map (its ``weight_transform_model_type``): A as stored, B times ``file scale / run scale``
    so that ``(alpha / rank) B A`` is the file's update. A run has checked the file before it read any
    weight (:func:`check_lora_file`, ``mm_trainer.check_lora_files``); this checks it again, on the tensors.

    Raises:
        LoraFileError: before any adapter is set, naming the file, the first mismatching keys and what the
            sub-model is (its ``architecture_name`` when it has one, e.g. an LTX-2 release).
    """
    from mm_checkpoint import read_lora_file

    model_type = getattr(module, "weight_transform_model_type", None)
    adapters = read_lora_file(str(targets.init_from), model_type=model_type)
    _refuse_misfit(module, targets, {p: (w.down.shape, w.up.shape) for p, w in adapters.items()})
    for p in targets.paths:
        layer, weights = module.get_submodule(p), adapters[p]
        _assign_full(layer.lora_A[ADAPTER_NAME].weight, weights.down.float())
        _assign_full(layer.lora_B[ADAPTER_NAME].weight, weights.up.float() * (weights.scale / targets.scale))


def inject_lora(model: nn.Module, sections: Mapping[str, Any]) -> LoraAdapters:
    """Inject LoRA into each sub-model of ``model`` (a ``ModelContainer``) whose section is not None.

    ``sections`` maps sub-model names to their ``lora`` config (``mm_config.LoraConfig`` or None). The
    container's checkpoints then hold only the adapters of those sub-models (``partial_checkpoints``).
    """
    targets: dict[str, LoraTargets] = {}
    single = getattr(model, "sub_model_names", ()) == ("model",)
    for name, section in sections.items():
        if section is None:
            continue
        where = "model.lora" if single else f"model.models.{name}.lora"
        module = getattr(model, name)
        paths = lora_target_paths(module, list(section.target_modules), where=where)
        init_from = getattr(section, "init_from", None)
        targets[name] = LoraTargets(where, int(section.rank), float(section.alpha), paths, init_from)
        inject_lora_layers(module, targets[name])
        model.partial_checkpoints[name] = adapter_keys(module)
    return LoraAdapters(targets)


@contextmanager
def adapters_disabled(modules: list[nn.Module]) -> Iterator[None]:
    """Inside, every peft LoRA layer of ``modules`` computes its base layer alone (``W x + b``): the model
    before its adapters, with no copy of its weights (Diffusion-DPO's reference of a LoRA policy).

    Raises:
        ValueError: ``modules`` hold no LoRA layer (there would be nothing to turn off: the caller would
            get the adapted model back as if it were the base).
    """
    layers = [m for module in modules for m in module.modules() if _is_lora_layer(m)]
    if not layers:
        raise ValueError(
            "adapters_disabled: the modules hold no LoRA layer (no model.models.<name>.lora section)"
        )
    before = [m._disable_adapters for m in layers]
    for layer in layers:
        layer._disable_adapters = True
    try:
        yield
    finally:
        for layer, state in zip(layers, before, strict=True):
            layer._disable_adapters = state


def _is_lora_layer(module: nn.Module) -> bool:
    return (
        hasattr(module, "_disable_adapters") and hasattr(module, "lora_A") and hasattr(module, "base_layer")
    )


def _base_key(key: str, prefix: str, heads: frozenset[str]) -> str | None:
    """``key`` as the base model names it; None for an adapter key."""
    rel = key[len(prefix) :]
    at = rel.find(_BASE)
    if at >= 0 and rel[: at + 1] in heads:
        return prefix + rel[: at + 1] + rel[at + len(_BASE) :]
    for part in _ADAPTER_PARTS:
        at = rel.find(part)
        if at >= 0 and rel[: at + 1] in heads:
            return None
    return key


def _assign_full(param: torch.Tensor, full: torch.Tensor) -> None:
    index = local_index(param)
    assign_local(param, full[index] if index is not None else full)
