"""LoRA adapters out of a training checkpoint: PEFT (diffusers) files, ComfyUI files, merged weights.

A training checkpoint of a LoRA run holds peft's adapter tensors under the module paths of the model:
``<path>.lora_A.default.weight`` (A, "down": rank x in) and ``<path>.lora_B.default.weight`` (B, "up":
out x rank); the layer computes ``W x + (alpha / rank) * B A x``. The three exports:

- :func:`save_peft_lora`: ``<prefix><path>.lora_A.weight`` / ``.lora_B.weight`` with peft's LoRA config
  (rank, alpha, targets) in the safetensors metadata under ``lora_adapter_metadata``: the layout
  diffusers' ``load_lora_weights`` reads (``prefix="transformer."``);
- :func:`save_comfy_lora`: ``diffusion_model.<path>.lora_down.weight`` / ``.lora_up.weight`` /
  ``.alpha`` (a 0-d tensor): the generic LoRA layout of ComfyUI's ``comfy/lora.py`` over its model's
  state-dict names (``diffusion_model.`` + the model's own keys);
- :func:`export_merged`: the base checkpoint with ``W + (alpha / rank) * B A`` written in place of each
  adapted ``W``, through the same key map and writer as :func:`export_checkpoint`.

Module paths are renamed for a file through the ``model_type`` key map (e.g. native Wan -> diffusers):
the key ``<path>.weight`` goes through the map and ``.weight`` comes off again.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from .dcp_io import DcpReader
from .errors import CheckpointFormatError
from .export import SubmoduleReader, _copy_config, _export
from .export_dir import check_no_overlap, export_into
from .formats import LORA_EXPORT_FORMATS, normalize_format, resolve_load_format
from .key_map_registry import get_weight_transform
from .key_maps import WeightTransform, apply_plan, planned_shape_dtype
from .layout import resolve_dcp_dir
from .runtime import barrier, get_rank, on_rank0
from .safetensors_io import TensorInfo, parse_size, read_header_bytes, save_safetensors
from .weight_readers import WeightsReader, open_weights

PEFT_WEIGHT_NAME = "pytorch_lora_weights.safetensors"
"""The file name diffusers' ``load_lora_weights(folder)`` looks for."""
PEFT_METADATA_KEY = "lora_adapter_metadata"
"""Safetensors metadata entry holding the LoRA config as JSON (diffusers' ``LORA_ADAPTER_METADATA_KEY``)."""
_DOWN, _UP = ".lora_A.", ".lora_B."


@dataclass(frozen=True)
class LoraWeights:
    """One adapted layer: ``down`` (A, rank x in), ``up`` (B, out x rank) and ``alpha``."""

    down: torch.Tensor
    up: torch.Tensor
    alpha: float

    @property
    def rank(self) -> int:
        return int(self.down.shape[0])

    @property
    def scale(self) -> float:
        """``alpha / rank``."""
        return self.alpha / self.rank

    def delta(self) -> torch.Tensor:
        """The weight update ``scale * up @ down`` in fp32 (out x in)."""
        return (self.up.float() @ self.down.float()) * self.scale


def read_lora_adapters(
    checkpoint: str | os.PathLike,
    *,
    alpha: float,
    submodule: str | None = None,
    iteration: int | None = None,
    ema: bool = False,
) -> dict[str, LoraWeights]:
    """Adapters of a DCP training checkpoint by module path (under ``submodule``, without its prefix);
    with ``ema``, their EMA (``training.ema``) instead of their last values.

    Raises:
        CheckpointFormatError: the checkpoint holds no adapter, or an A without its B (or the reverse).
    """
    path, _ = resolve_dcp_dir(checkpoint, iteration)
    reader: DcpReader | SubmoduleReader = DcpReader(path, ema=ema)
    if submodule is not None:
        reader = SubmoduleReader(reader, submodule)
    pairs: dict[str, dict[str, str]] = {}
    for key in reader.keys():
        for part, side in ((_DOWN, "down"), (_UP, "up")):
            if part in key:
                pairs.setdefault(key[: key.index(part)], {})[side] = key
    where = f"{path}" + (f" (under {submodule!r})" if submodule else "")
    if not pairs:
        raise CheckpointFormatError(f"{where} holds no LoRA adapter (no `.lora_A.` / `.lora_B.` tensors)")
    broken = sorted(p for p, sides in pairs.items() if len(sides) != 2)
    if broken:
        raise CheckpointFormatError(f"{where}: adapters without both lora_A and lora_B: {broken[:5]}")
    tensors = reader.read_many([k for sides in pairs.values() for k in sides.values()])
    return {
        p: LoraWeights(tensors[sides["down"]], tensors[sides["up"]], float(alpha))
        for p, sides in pairs.items()
    }


def renamed_paths(adapters: Mapping[str, LoraWeights], model_type: str | None) -> dict[str, LoraWeights]:
    """``adapters`` keyed by the module paths of the ``model_type`` key map's checkpoint side."""
    transform = get_weight_transform(model_type)
    out: dict[str, LoraWeights] = {}
    for path, weights in adapters.items():
        plans = transform.plan_export([f"{path}.weight"])
        (key,) = plans
        if not key.endswith(".weight") or plans[key].fn is not None:
            raise CheckpointFormatError(
                f"key map {model_type!r} does not rename {path}.weight to one `.weight` tensor (got {key!r})"
            )
        out[key[: -len(".weight")]] = weights
    return out


LORA_FILE_PREFIXES = ("transformer.", "diffusion_model.")
"""The prefixes a LoRA file's keys may carry (diffusers' component name, ComfyUI's diffusion-model prefix)."""
_FILE_SIDES = {".lora_A.weight": "down", ".lora_B.weight": "up", ".lora_down.weight": "down", ".lora_up.weight": "up"}  # fmt: skip


def read_lora_file(path: str | os.PathLike, *, model_type: str | None = None) -> dict[str, LoraWeights]:
    """Adapters of a LoRA ``.safetensors`` file by the model's module path: the PEFT / diffusers layout
    (``<prefix><path>.lora_A.weight`` / ``.lora_B.weight``, rank and ``lora_alpha`` in its
    ``lora_adapter_metadata``), ComfyUI's (``lora_down`` / ``lora_up`` and an ``.alpha`` tensor), or A/B
    without alpha (read at scale 1, e.g. the official LTX-2 trainer's: ``alpha = rank``). One prefix of
    :data:`LORA_FILE_PREFIXES` shared by every key comes off; the module names go through the ``model_type``
    key map (``<name>.weight`` -> the model's ``<path>.weight``).

    Raises:
        CheckpointFormatError: no adapter, an A without its B (or the reverse), or a key of no known layout.
    """
    with open_weights(path) as reader:
        prefix, layers = _file_layers(path, reader.keys())
        tensors = {k: reader.read(k) for k in reader.keys()}
    metadata = json.loads(read_header_bytes(path)).get("__metadata__") or {}
    peft = json.loads(metadata.get(PEFT_METADATA_KEY, "{}"))
    transform = get_weight_transform(model_type)
    out = {}
    for name, sides in layers.items():
        down, up = tensors[sides["down"]], tensors[sides["up"]]
        rank = int(down.shape[0])
        alpha = (
            float(tensors[sides["alpha"]])
            if "alpha" in sides
            else float(peft.get(f"{prefix}lora_alpha", rank))
        )
        out[_model_path(transform, name)] = LoraWeights(down, up, alpha)
    return out


def read_lora_file_shapes(
    path: str | os.PathLike, *, model_type: str | None = None
) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    """``{module path: (A's shape, B's shape)}`` of a LoRA file, its layers named as :func:`read_lora_file`
    names them, from the safetensors header alone (no tensor is read): what a run checks a file against
    before it reads any weight.

    Raises:
        CheckpointFormatError: as :func:`read_lora_file`.
    """
    with open_weights(path) as reader:
        _, layers = _file_layers(path, reader.keys())
        shapes = {n: (reader.info(s["down"]).shape, reader.info(s["up"]).shape) for n, s in layers.items()}
    transform = get_weight_transform(model_type)
    return {_model_path(transform, name): pair for name, pair in shapes.items()}


def _file_layers(path: str | os.PathLike, keys: list[str]) -> tuple[str, dict[str, dict[str, str]]]:
    """``(prefix, {layer name: {"down" | "up" | "alpha": key}})`` of a LoRA file's keys: the one prefix of
    :data:`LORA_FILE_PREFIXES` that every key shares ("" when none), each layer's tensors paired.

    Raises:
        CheckpointFormatError: a key of no LoRA layout, or a layer without both A and B (or no layer).
    """
    prefix = next((p for p in LORA_FILE_PREFIXES if keys and all(k.startswith(p) for k in keys)), "")
    layers: dict[str, dict[str, str]] = {}
    for key in keys:
        name = key.removeprefix(prefix)
        end = next((e for e in (*_FILE_SIDES, ".alpha") if name.endswith(e)), None)
        if end is None:
            raise CheckpointFormatError(
                f"{path}: {key!r} is no LoRA tensor (expected .lora_A / .lora_B weights)"
            )
        layers.setdefault(name.removesuffix(end), {})[_FILE_SIDES.get(end, "alpha")] = key
    broken = sorted(n for n, sides in layers.items() if not {"down", "up"} <= set(sides))
    if not layers or broken:
        raise CheckpointFormatError(f"{path}: adapters without both A and B: {broken[:5] or 'none at all'}")
    return prefix, layers


def _model_path(transform: WeightTransform, name: str) -> str:
    """The model's module path of a file's layer ``name`` through the key map (``name`` itself when the map
    does not rename ``<name>.weight`` to one key: the caller then finds no such layer)."""
    plans = transform.plan_load([f"{name}.weight"])
    key = next(iter(plans)) if len(plans) == 1 else f"{name}.weight"
    return key.removesuffix(".weight")


def save_peft_lora(
    adapters: Mapping[str, LoraWeights],
    out_file: str | os.PathLike,
    *,
    prefix: str = "transformer.",
    model_type: str | None = None,
    dtype: torch.dtype | None = None,
) -> Path:
    """Write the PEFT / diffusers layout: ``<prefix><path>.lora_A.weight`` / ``.lora_B.weight`` plus the
    LoRA config (``r``, ``lora_alpha``, ``target_modules``) as JSON in the metadata, keyed with ``prefix``.

    All adapters must share one rank and alpha (one LoRA section per sub-model).
    """
    named = renamed_paths(adapters, model_type)
    rank, alpha = _common_rank_alpha(named)
    tensors: dict[str, torch.Tensor] = {}
    for path, w in named.items():
        tensors[f"{prefix}{path}.lora_A.weight"] = _cast(w.down, dtype)
        tensors[f"{prefix}{path}.lora_B.weight"] = _cast(w.up, dtype)
    config = {"r": rank, "lora_alpha": alpha, "target_modules": sorted(named), "lora_dropout": 0.0}
    metadata = {PEFT_METADATA_KEY: json.dumps({f"{prefix}{k}": v for k, v in config.items()}), "format": "pt"}
    return _save(tensors, out_file, metadata)


def save_comfy_lora(
    adapters: Mapping[str, LoraWeights],
    out_file: str | os.PathLike,
    *,
    prefix: str = "diffusion_model.",
    model_type: str | None = None,
    dtype: torch.dtype | None = None,
    alpha_folded: bool = False,
) -> Path:
    """Write ComfyUI's layout: ``<prefix><path>.lora_down.weight`` (A), ``.lora_up.weight`` (B) and
    ``.alpha`` (0-d fp32); the loader scales ``up @ down`` by ``alpha / rank``. Module paths are
    renamed to the ``model_type`` key map's checkpoint side.

    ``alpha_folded``: ``<prefix><path>.lora_A.weight`` (A) and ``.lora_B.weight`` (``alpha / rank * B``,
    scaled in fp32) and no alpha tensors: the layout of files read at scale 1 (the official LTX-2
    trainer's, which ComfyUI and diffusers' LTX-2 loader read; diffusers refuses a key without "lora",
    such as ``.alpha``, in an LTX-2 file)."""
    tensors: dict[str, torch.Tensor] = {}
    for path, w in renamed_paths(adapters, model_type).items():
        if alpha_folded:
            tensors[f"{prefix}{path}.lora_A.weight"] = _cast(w.down, dtype)
            tensors[f"{prefix}{path}.lora_B.weight"] = _cast((w.up.float() * w.scale).to(w.up.dtype), dtype)
            continue
        tensors[f"{prefix}{path}.lora_down.weight"] = _cast(w.down, dtype)
        tensors[f"{prefix}{path}.lora_up.weight"] = _cast(w.up, dtype)
        tensors[f"{prefix}{path}.alpha"] = torch.tensor(w.alpha, dtype=torch.float32)
    return _save(tensors, out_file, {"format": "pt"})


class MergedReader:
    """The base checkpoint's tensors under model keys, each adapted ``<path>.weight`` plus its delta."""

    def __init__(self, base: str | os.PathLike, adapters: Mapping[str, LoraWeights], model_type: str | None):
        self.adapters = dict(adapters)
        fmt = resolve_load_format(base)
        if fmt == "dcp":
            self._reader: DcpReader | WeightsReader = DcpReader(resolve_dcp_dir(base)[0])
            self._plans = {k: None for k in self._reader.keys()}
        else:
            self._reader = open_weights(base)
            self._plans = get_weight_transform(model_type).plan_load(self._reader.keys())
        absent = sorted(p for p in self.adapters if f"{p}.weight" not in self._plans)
        if absent:
            raise CheckpointFormatError(f"base {base} has no weight for the adapted layers {absent[:5]}")

    def keys(self) -> list[str]:
        return list(self._plans)

    def info(self, key: str) -> TensorInfo:
        plan = self._plans[key]
        if plan is None:
            return self._reader.info(key)
        shape, dtype = planned_shape_dtype(
            plan, [(i.shape, i.dtype) for i in map(self._reader.info, plan.sources)]
        )
        return TensorInfo(shape, dtype)

    def read_many(self, keys: list[str]) -> dict[str, torch.Tensor]:
        return {key: self._read(key) for key in keys}

    def _read(self, key: str) -> torch.Tensor:
        plan = self._plans[key]
        value = (
            self._reader.read(key)
            if plan is None
            else apply_plan(plan, [self._reader.read(s) for s in plan.sources])
        )
        adapter = self.adapters.get(key[: -len(".weight")]) if key.endswith(".weight") else None
        if adapter is None:
            return value
        return (value.float() + adapter.delta()).to(value.dtype)


def export_merged(
    base: str | os.PathLike,
    adapters: Mapping[str, LoraWeights],
    out_dir: str | os.PathLike,
    *,
    to: str = "diffusers",
    model_type: str | None = None,
    config_from: str | os.PathLike | None = None,
    max_shard_size: int | str = "5GB",
    dtype: torch.dtype | None = None,
) -> Path:
    """Write the base model with the adapters merged (``W + alpha/rank * B A`` in fp32, stored in W's
    dtype) as a ``to`` folder (diffusers / hf) through ``model_type``'s key map. Rank 0 writes."""
    target = normalize_format(to)
    if target not in {"diffusers", "hf", "safetensors"}:
        raise CheckpointFormatError(f"cannot export to {to!r}; expected diffusers, hf or safetensors")
    with export_into(out_dir, sources=(base, config_from)) as out:
        if get_rank() == 0:
            reader = MergedReader(base, adapters, model_type)
            _export(reader, out, target, model_type, parse_size(max_shard_size), dtype)
            _copy_config(Path(base), Path(base), config_from, out)
    return Path(out_dir)


def export_lora(
    checkpoint: str | os.PathLike,
    out: str | os.PathLike,
    fmt: str,
    *,
    alpha: float,
    submodule: str | None = None,
    base: str | os.PathLike | None = None,
    model_type: str | None = None,
    file_model_type: str | None = None,
    config_from: str | os.PathLike | None = None,
    ema: bool = False,
    comfy_model_type: str | None = None,
    comfy_alpha_folded: bool = False,
) -> Path:
    """Export the adapters of ``checkpoint`` (latest iteration, keys under ``submodule``; with ``ema``
    their EMA, ``training.ema``) as ``fmt``:

    - ``peft``: ``out/pytorch_lora_weights.safetensors`` (:func:`save_peft_lora`, prefix ``transformer.``),
      module paths renamed through ``file_model_type``;
    - ``comfyui``: the file ``out`` (:func:`save_comfy_lora`, prefix ``diffusion_model.``), module paths
      renamed through ``comfy_model_type`` (None: the model's own), ``comfy_alpha_folded`` its layout;
    - ``merged``: the folder ``out``, ``base`` with the adapters merged (:func:`export_merged`, diffusers
      layout): ``model_type`` maps the base's keys to the model's and back.
    """
    if fmt not in LORA_EXPORT_FORMATS:
        raise ValueError(f"LoRA export format {fmt!r}: expected one of {', '.join(LORA_EXPORT_FORMATS)}")
    read = resolve_dcp_dir(checkpoint)[0]  # the iteration read: a folder beside it in the run root is fine
    on_rank0(lambda: check_no_overlap(out, (read, base, config_from)))  # before reading anything
    adapters = read_lora_adapters(checkpoint, alpha=alpha, submodule=submodule, ema=ema)
    if fmt == "peft":
        with export_into(out, sources=(read,)) as folder:
            save_peft_lora(adapters, folder / PEFT_WEIGHT_NAME, model_type=file_model_type)
        return Path(out) / PEFT_WEIGHT_NAME
    if fmt == "comfyui":
        return save_comfy_lora(adapters, out, model_type=comfy_model_type, alpha_folded=comfy_alpha_folded)
    if base is None:
        raise ValueError("a merged LoRA export needs the base weights (the sub-model's from_pretrained)")
    return export_merged(base, adapters, out, to="diffusers", model_type=model_type, config_from=config_from)


def _common_rank_alpha(adapters: Mapping[str, LoraWeights]) -> tuple[int, float]:
    pairs = {(w.rank, w.alpha) for w in adapters.values()}
    if len(pairs) != 1:
        raise CheckpointFormatError(f"adapters of one file must share rank and alpha; found {sorted(pairs)}")
    return next(iter(pairs))


def _cast(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    return tensor.detach().to(dtype or tensor.dtype).contiguous()


def _save(tensors: dict[str, torch.Tensor], out_file: str | os.PathLike, metadata: dict[str, str]) -> Path:
    path = Path(out_file)
    if path.suffix != ".safetensors":
        raise CheckpointFormatError(f"{path}: a LoRA file is written as .safetensors")
    if get_rank() == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        save_safetensors(tensors, path, metadata)
    barrier()
    return path
