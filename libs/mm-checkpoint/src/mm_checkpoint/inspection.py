"""Read-only views used by ``mm-ckpt inspect`` and ``mm-ckpt verify``."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field

import torch

from .dcp_io import DcpReader
from .formats import resolve_load_format
from .key_map_registry import get_weight_transform
from .key_maps import KeyPlan, apply_plan
from .layout import resolve_dcp_dir
from .runtime import progress
from .safetensors_io import PACKED_DTYPE_BITS, SafetensorsReader
from .weight_readers import WeightsReader, open_weights


@dataclass(frozen=True)
class MappedSource:
    """A checkpoint seen in the model key namespace: ``plans`` build model tensors from ``reader``."""

    path: str
    format: str
    reader: WeightsReader | DcpReader
    plans: dict[str, KeyPlan]

    def read(self, key: str) -> torch.Tensor:
        plan = self.plans[key]
        return apply_plan(plan, [self.reader.read(s) for s in plan.sources])


def open_mapped_source(
    path: str | os.PathLike, fmt: str = "auto", model_type: str | None = None, *, raw: bool = False
) -> MappedSource:
    """Open a checkpoint of any format; safetensors / ``.pth`` keys go through the ``model_type`` key map,
    DCP keys as stored (``raw``: a ComfyUI file's tensors as stored, not dequantized)."""
    resolved = resolve_load_format(path, fmt)
    if resolved == "dcp":
        reader: WeightsReader | DcpReader = DcpReader(resolve_dcp_dir(path)[0])
        plans = {k: KeyPlan(k, (k,)) for k in reader.keys()}
    else:
        reader = open_weights(path, raw=raw)
        plans = get_weight_transform(model_type).plan_load(reader.keys())
    return MappedSource(str(path), resolved, reader, plans)


@dataclass
class Summary:
    """What ``inspect`` prints."""

    path: str
    format: str
    tensors: int
    total_bytes: int
    dtypes: dict[str, int]
    sample_keys: list[str]


def summarize(path: str | os.PathLike, fmt: str = "auto", sample: int = 5) -> Summary:
    """Format, tensor count, total bytes, dtype histogram and a few keys of the checkpoint at ``path``.

    Dtypes are torch's names; a safetensors dtype torch has no element type for (``F4``, ``F6_*``)
    keeps its safetensors name and counts the bytes its header gives.
    """
    src = open_mapped_source(path, fmt, raw=True)
    keys = src.reader.keys()
    sizes: list[tuple[str, int]] = []
    for key in keys:
        if isinstance(src.reader, SafetensorsReader) and src.reader.stored(key).dtype in PACKED_DTYPE_BITS:
            stored = src.reader.stored(key)
            sizes.append((stored.dtype, stored.nbytes))
        else:
            info = src.reader.info(key)
            sizes.append((str(info.dtype).replace("torch.", ""), info.nbytes))
    dtypes = Counter(name for name, _ in sizes)
    return Summary(
        str(path), src.format, len(keys), sum(n for _, n in sizes), dict(dtypes), sorted(keys)[:sample]
    )


def check_atol(atol: float) -> float:
    """``atol`` if it is a valid tolerance (>= 0; ``inf`` accepts any finite difference), else ValueError."""
    if not atol >= 0:  # also NaN, which no comparison would ever fail
        raise ValueError(f"atol must be >= 0 (inf accepts any finite difference), got {atol}")
    return atol


@dataclass
class VerifyResult:
    """Comparison of two checkpoints in the model key namespace.

    ``nan_mismatch`` lists tensors where one side is NaN and the other is not at some element (NaN on
    both sides at the same place counts as equal); ``inf_mismatch`` those where an infinity meets
    anything but the same infinity (``+inf`` vs ``-inf`` or a finite value). Both make the checkpoints
    DIFFERENT at any tolerance. ``dtype_mismatch`` lists ``key (dtype A vs dtype B)`` where equal values
    are stored at different precision (fp32 vs bf16, float vs int): DIFFERENT unless dtypes are ignored.
    """

    only_in_a: list[str] = field(default_factory=list)
    only_in_b: list[str] = field(default_factory=list)
    shape_mismatch: list[str] = field(default_factory=list)
    nan_mismatch: list[str] = field(default_factory=list)
    inf_mismatch: list[str] = field(default_factory=list)
    dtype_mismatch: list[str] = field(default_factory=list)
    max_abs_diff: float = 0.0
    worst_key: str | None = None
    compared: int = 0

    def same(self, atol: float = 0.0, *, ignore_dtype: bool = False) -> bool:
        """True when both hold the same keys, shapes and dtypes (``ignore_dtype``: any dtypes), the same
        NaN and infinity positions, and every other element differs by at most ``atol`` (>= 0)."""
        check_atol(atol)
        differ = self.only_in_a or self.only_in_b or self.shape_mismatch or self.nan_mismatch
        differ = differ or self.inf_mismatch or (self.dtype_mismatch and not ignore_dtype)
        return not differ and self.max_abs_diff <= atol


def max_abs_difference(a: torch.Tensor, b: torch.Tensor) -> tuple[float, bool, bool]:
    """``(max |a - b| over finite pairs, NaN positions differ, infinities differ)``; equal values
    (infinities included) and NaN on both sides differ by 0."""
    if not a.numel():
        return 0.0, False, False
    a, b = a.double(), b.double()
    nan_a, nan_b = torch.isnan(a), torch.isnan(b)
    infinite = (torch.isinf(a) | torch.isinf(b)) & (a != b) & ~(nan_a | nan_b)
    diff = (a - b).abs()
    diff[(a == b) | nan_a | nan_b | infinite] = 0.0
    return diff.max().item(), bool((nan_a ^ nan_b).any()), bool(infinite.any())


def verify_checkpoints(
    a: str | os.PathLike,
    b: str | os.PathLike,
    model_type: str | None = None,
    fmt_a: str = "auto",
    fmt_b: str = "auto",
) -> VerifyResult:
    """Compare every tensor of ``a`` and ``b`` after key mapping, one tensor pair in memory at a time."""
    src_a, src_b = open_mapped_source(a, fmt_a, model_type), open_mapped_source(b, fmt_b, model_type)
    keys_a, keys_b = set(src_a.plans), set(src_b.plans)
    result = VerifyResult(sorted(keys_a - keys_b), sorted(keys_b - keys_a))
    common = sorted(keys_a & keys_b)
    for key in progress(common, desc="verify", total=len(common), unit="tensor"):
        ta, tb = src_a.read(key), src_b.read(key)
        if ta.shape != tb.shape:
            result.shape_mismatch.append(key)
            continue
        if ta.dtype != tb.dtype:
            result.dtype_mismatch.append(f"{key} ({_dtype_name(ta.dtype)} vs {_dtype_name(tb.dtype)})")
        diff, nan_differs, inf_differs = max_abs_difference(ta, tb)
        if nan_differs:
            result.nan_mismatch.append(key)
        if inf_differs:
            result.inf_mismatch.append(key)
        result.compared += 1
        if diff > result.max_abs_diff or result.worst_key is None:
            result.max_abs_diff, result.worst_key = max(diff, result.max_abs_diff), key
    return result


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")
