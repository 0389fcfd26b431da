"""The encode phase of a preprocess run: this rank's rows, decoded in DataLoader workers, encoded in the
main process, each written as a staged sample file (docs/DESIGN.md "Latent cache").

Memory is bounded: at most ``num_workers * prefetch`` decoded clips wait for the encoder. Every sample
file appears atomically, so a run killed at any moment leaves only complete samples, which the next run
reuses. With an encoder sharded over the ranks (FSDP: every forward gathers parameters from all ranks)
each rank must call it as often as the others: ``lockstep_calls`` is the largest share of any rank, and a
rank with fewer rows, or a row whose clip could not be decoded, calls ``idle()`` instead.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

from .cache_plan import CachePlan, staged_bad, staged_file
from .decode import DecodeError
from .shards import write_sample_file

__all__ = ["EncodeResult", "KILL_HOOK_ENV", "encode_rows", "split_encoded"]

KILL_HOOK_ENV = "MM_DATA_CACHE_KILL_AT"
"""Test hook: ``encoded:N`` / ``packed:N`` SIGKILLs this process after its N-th staged sample / shard,
so a test interrupts a run at a chosen point instead of racing a timer."""


def kill_hook(event: str, count: int) -> None:
    """SIGKILL this process when :data:`KILL_HOOK_ENV` names ``event:count``."""
    if os.environ.get(KILL_HOOK_ENV) == f"{event}:{count}":
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass
class EncodeResult:
    """What this rank encoded: rows written, rows whose clip could not be decoded, seconds spent."""

    computed: list[int] = field(default_factory=list)
    failed: dict[int, tuple[str, str]] = field(default_factory=dict)
    seconds: float = 0.0


class _DecodeJobs(Dataset):
    """Item ``j`` is row ``rows[j]`` decoded (never replaced), or ``{"index", "error"}`` when it cannot be."""

    def __init__(self, dataset: Any, rows: Sequence[int]) -> None:
        self.dataset, self.rows = dataset, list(rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, j: int) -> dict[str, Any]:
        row = self.rows[j]
        try:
            return self.dataset.sample(row)
        except DecodeError as e:
            path = self.dataset.rows[row]["path"]
            return {"index": row, "error": str(e).removeprefix(f"{path}: ")}


def _one_thread(_: int) -> None:
    torch.set_num_threads(1)


def _as_is(item: Any) -> Any:
    return item


def split_encoded(encoded: Mapping[str, Any], row: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """An encoder's output -> (tensors, JSON metadata): tensors stay, a ``metadata`` dict and every other
    value go into the metadata."""
    tensors = {k: v for k, v in encoded.items() if isinstance(v, torch.Tensor)}
    metadata = dict(encoded.get("metadata", {}) or {})
    metadata.update({k: v for k, v in encoded.items() if k != "metadata" and not isinstance(v, torch.Tensor)})
    if not tensors:
        raise ValueError(f"row {row}: the encoder returned no tensors (keys {sorted(encoded)})")
    return tensors, metadata


def encode_rows(
    dataset: Any,
    plan: CachePlan,
    rows: Sequence[int],
    encode: Callable[[dict[str, Any]], Mapping[str, Any]],
    *,
    num_workers: int,
    prefetch: int,
    lockstep_calls: int | None = None,
    idle: Callable[[], None] | None = None,
    progress: bool = True,
    rank: int = 0,
) -> EncodeResult:
    """Decode ``rows`` of ``dataset`` in ``num_workers`` DataLoader workers (0: in this process) and stage
    ``encode(item)`` for each; ``item`` carries ``key`` and ``clip_sha256`` besides the clip's fields."""
    root = plan.root
    (root / "staging").mkdir(parents=True, exist_ok=True)
    loader_kwargs: dict[str, Any] = {"batch_size": None, "num_workers": num_workers, "collate_fn": _as_is}
    if num_workers > 0:
        loader_kwargs.update(prefetch_factor=prefetch, worker_init_fn=_one_thread)
    loader = DataLoader(_DecodeJobs(dataset, rows), **loader_kwargs)
    result = EncodeResult()
    bar = tqdm(total=len(rows), unit="clip", desc=f"encode (rank {rank})", disable=not progress or rank != 0)
    start = time.perf_counter()
    calls = 0
    for item in loader:
        row = int(item["index"])
        key = plan.keys[row]
        assert key is not None
        if "error" in item:
            _write_json(staged_bad(root, key), {"path": dataset.rows[row]["path"], "reason": item["error"]})
            result.failed[row] = (dataset.rows[row]["path"], item["error"])
            if idle is not None:
                idle()
        else:
            item.update(key=key, clip_sha256=plan.digests[row])
            tensors, metadata = split_encoded(encode(item), row)
            write_sample_file(staged_file(root, key), key, tensors, metadata)
            result.computed.append(row)
            kill_hook("encoded", len(result.computed))
        calls += 1
        bar.update(1)
    for _ in range(calls, lockstep_calls or 0):
        assert idle is not None, "lockstep_calls needs idle"
        idle()
    bar.close()
    result.seconds = time.perf_counter() - start
    return result


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, sort_keys=True))
    os.replace(tmp, path)
