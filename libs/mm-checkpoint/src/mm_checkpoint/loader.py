"""Load HF / diffusers safetensors, ComfyUI single files, ``.pth`` state dicts or DCP weights into a plain,
meta, or FSDP2-sharded module."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from .dcp_io import DcpReader, load_dcp_into
from .errors import CheckpointLoadError
from .key_maps import WeightTransform, apply_plan
from .layout import resolve_dcp_dir
from .module_state import Target, assign_local, checkpoint_targets, local_index
from .runtime import progress
from .weight_readers import open_weights


@dataclass
class LoadReport:
    """What a load did, by model state-dict key.

    Attributes:
        path: directory actually read (the DCP cache after an online conversion).
        format: ``dcp``, ``diffusers`` or ``hf``.
        loaded / missing / unexpected / mismatched: model keys; ``unexpected`` are checkpoint tensors
            (after key mapping) the model lacks; ``mismatched`` have different shapes (see ``details``).
        uninitialized_buffers: meta non-persistent buffers left uninitialized by materialization.
        converted_from: the source read by an online DCP conversion in this call, if any.
    """

    path: str
    format: str
    loaded: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)
    details: dict[str, str] = field(default_factory=dict)
    uninitialized_buffers: list[str] = field(default_factory=list)
    converted_from: str | None = None

    @property
    def complete(self) -> bool:
        """True when nothing is missing, unexpected or mismatched."""
        return not (self.missing or self.unexpected or self.mismatched)

    def raise_if_incomplete(self) -> None:
        """Raise :class:`CheckpointLoadError` naming every problem key."""
        if self.complete:
            return
        lines = [f"loading {self.format} checkpoint {self.path} failed (strict):"]
        why = explain_key_mismatch(self.missing, self.unexpected)
        if why:
            lines.append(f"  {why}")
        for label, keys in (("missing", self.missing), ("unexpected", self.unexpected)):
            if keys:
                lines.append(f"  {len(keys)} {label}: {keys[:20]}{' ...' if len(keys) > 20 else ''}")
        for key in self.mismatched[:20]:
            lines.append(f"  shape mismatch {key}: {self.details.get(key, '')}")
        raise CheckpointLoadError("\n".join(lines))


def explain_key_mismatch(missing: list[str], unexpected: list[str]) -> str | None:
    """Why a load found these keys missing and unexpected, when one prefix explains at least half of the
    missing ones: the source stores the model's tensors under a prefix the model's keys lack (``module.``
    of a DDP save, a bundling file's ``model.``), or the model's keys carry one the source's lack. Names
    the prefix, how many keys it explains and the keys it leaves (the source's foreign tensors); None
    when no prefix explains that many."""
    prefix, matched = _prefix_over(unexpected, set(missing))
    if prefix is not None and 2 * len(matched) >= len(missing):
        others = [k for k in unexpected if k not in matched]
        rest = f"; its other {len(others)} tensors are not the model's: {others[:10]}" if others else ""
        return (
            f"{len(matched)} of the {len(missing)} missing keys are in the source under the prefix `{prefix}`, "
            f"which the model's keys do not have{rest}"
        )
    prefix, matched = _prefix_over(missing, set(unexpected))
    if prefix is not None and 2 * len(matched) >= len(missing):
        return (
            f"{len(matched)} of the {len(missing)} missing keys are source keys with the prefix `{prefix}` in "
            "front: the model's keys have it, the source's do not"
        )
    return None


def _prefix_over(longer: list[str], shorter: set[str]) -> tuple[str | None, list[str]]:
    """The dotted prefix ``p`` for which most keys ``p + k`` of ``longer`` have ``k`` in ``shorter``, and
    those keys of ``longer``."""
    by_prefix: dict[str, list[str]] = {}
    for key in longer:
        for i, char in enumerate(key):
            if char == "." and key[i + 1 :] in shorter:
                by_prefix.setdefault(key[: i + 1], []).append(key)
    if not by_prefix:
        return None, []
    prefix = max(by_prefix, key=lambda p: len(by_prefix[p]))
    return prefix, by_prefix[prefix]


def _finish(report: LoadReport, targets: dict[str, Target], seen: set[str]) -> LoadReport:
    loaded_ids = {id(targets[k].tensor) for k in report.loaded}
    report.missing = [k for k, t in targets.items() if k not in seen and id(t.tensor) not in loaded_ids]
    return report


def load_safetensors_into(
    model: nn.Module, path: str | os.PathLike, transform: WeightTransform, fmt: str
) -> LoadReport:
    """Load safetensors (or ``.pth``, or ComfyUI single-file) weights through ``transform``
    (:func:`~mm_checkpoint.weight_readers.open_weights`); DTensor targets read only their local slices."""
    report = LoadReport(str(path), fmt)
    targets = checkpoint_targets(model)
    seen: set[str] = set()
    with open_weights(path) as reader:
        plans = transform.plan_load(reader.keys())
        for key, plan in progress(
            plans.items(), desc=f"load {Path(path).name}", total=len(plans), unit="tensor"
        ):
            if key not in targets:
                report.unexpected.append(key)
                continue
            seen.add(key)
            target = targets[key].tensor
            index = local_index(target)
            if plan.fn is None:
                stored = reader.info(plan.sources[0]).shape
                if stored != tuple(target.shape):
                    _mismatch(report, key, plan.sources[0], stored, target)
                    continue
                value = reader.read(plan.sources[0], index)
            else:
                value = apply_plan(plan, [reader.read(s) for s in plan.sources])
                if tuple(value.shape) != tuple(target.shape):
                    _mismatch(report, key, plan.sources, tuple(value.shape), target)
                    continue
                value = value[index] if index is not None else value
            assign_local(target, value)
            report.loaded.append(key)
    return _finish(report, targets, seen)


def _mismatch(report: LoadReport, key: str, source: object, stored: tuple, target: torch.Tensor) -> None:
    report.mismatched.append(key)
    report.details[key] = (
        f"checkpoint {source} has shape {tuple(stored)}, model expects {tuple(target.shape)}"
    )


def load_dcp_weights_into(model: nn.Module, path: str | os.PathLike) -> LoadReport:
    """Load model tensors from a DCP checkpoint (root with tracker/iter dirs, or a DCP dir), resharding as needed."""
    dcp_dir, _ = resolve_dcp_dir(path)
    report = LoadReport(str(dcp_dir), "dcp")
    reader = DcpReader(dcp_dir)
    targets = checkpoint_targets(model)
    state: dict[str, torch.Tensor] = {}
    done_ids: set[int] = set()
    for key in reader.keys():
        if key not in targets:
            report.unexpected.append(key)
            continue
        target = targets[key].tensor
        stored = reader.info(key).shape
        if stored != tuple(target.shape):
            _mismatch(report, key, key, stored, target)
            continue
        report.loaded.append(key)
        if id(target) not in done_ids:  # tied aliases share storage: load once
            done_ids.add(id(target))
            state[key] = target.detach()
    load_dcp_into(state, dcp_dir, reader.prefix)
    return _finish(report, targets, set(reader.keys()))
