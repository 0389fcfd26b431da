"""`cache_dataset`: run the user's encoders over a clip dataset once, into a sharded, content-keyed,
incremental cache (docs/DESIGN.md "Latent cache").

A run, on every rank (one process, or each rank of ``torchrun``):

0. **lock and check** (rank 0 takes :class:`~mm_data.cache_lock.CacheLock`: a second run of the folder
   is refused naming the first); every clip is hashed from its bytes (rank 0, in ``probe_workers``
   processes: :func:`~mm_data.clip_info.clip_digests`) and every file of the folder is verified (each
   tensor's CRC-32, the files split over the ranks: :func:`~mm_data.shards.verify_shard`); the ranks
   share the results;
1. **plan** (:mod:`mm_data.cache_plan`): each row's content key; what the folder already holds (files
   that failed verification hold nothing); this rank's rows (``i % W == rank`` among the rows whose key
   is cached nowhere);
2. **encode** (:mod:`mm_data.cache_encode`): decode in DataLoader workers, encode, stage each sample
   as its own file (atomic; an interrupted run keeps every finished sample);
3. **pack** (after all ranks have encoded): the shard layout of the good samples
   (:func:`mm_data.cache_index.shard_layout`, a function of the samples alone); rank ``r`` writes the
   shards ``j % W == r`` that do not exist yet, copying reused samples from their old shards and new
   ones from the staging folder;
4. **commit** (rank 0): write ``index.json`` atomically, with how the cache was made
   (:mod:`mm_data.cache_made_with`), then remove the shards no longer listed and the staging folder.

A re-run therefore encodes only what changed, drops what was removed, and a run killed at any point
resumes where it stopped and ends with the same bytes as an uninterrupted run. Ranks meet after the
lock and each check (rank 0's result or error reaches every rank: :func:`from_rank0`) and at three
barriers (a gloo group with a long timeout: a rank with more rows is waited for); a failing rank ends
the job through ``torchrun``, as any failure.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist

from .bad_samples import BadSample
from .cache_encode import EncodeResult, encode_rows, kill_hook
from .cache_index import CacheIndex, ShardEntry, shard_layout, shard_name
from .cache_lock import CacheLock
from .cache_made_with import made_with
from .cache_plan import (
    STAGING,
    CachePlan,
    Location,
    cache_files,
    plan_cache,
    previous_index,
    staged_file,
    verify_files,
)
from .clip_info import clip_digests
from .shards import CorruptShardError, ShardReader, read_shard_header, write_shard

__all__ = ["CacheReport", "cache_dataset", "from_rank0"]

BARRIER_TIMEOUT = timedelta(hours=24)
"""How long a rank that finished encoding waits for the others (ranks' shares differ by what is cached)."""


@dataclass
class CacheReport:
    """What a preprocess run did (the same totals on every rank).

    ``reused``: rows whose sample was cached before this run (``resumed``: of those, left by an
    interrupted run); ``computed``: rows encoded by this run; ``failed``: rows the source could not read
    (not cached: training replaces them as it replaces bad clips); ``dropped``: cached samples no row
    needs any more (removed or changed rows); ``corrupt``: files of the folder that failed verification
    (each named with why and the rows it held: encoded again); ``rewritten``: clips whose bytes changed
    under an unchanged size and mtime.
    """

    out_dir: str
    rank: int
    world_size: int
    samples: int
    reused: list[int] = field(default_factory=list)
    resumed: list[int] = field(default_factory=list)
    computed: list[int] = field(default_factory=list)
    failed: list[BadSample] = field(default_factory=list)
    dropped: int = 0
    corrupt: list[str] = field(default_factory=list)
    rewritten: list[str] = field(default_factory=list)
    shards_written: int = 0
    shards_kept: int = 0
    shards_removed: int = 0
    encode_seconds: float = 0.0
    """Longest encode phase of any rank."""
    hash_seconds: float = 0.0
    """Hashing every clip (rank 0)."""
    verify_seconds: float = 0.0
    """Verifying the folder's files (the longest share of any rank)."""
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    """Lines the encoder adds about the samples (e.g. LTX-2's clips encoded without an audio track)."""

    @property
    def clips_per_second(self) -> float:
        """Clips encoded per second over all ranks (encode phase)."""
        return len(self.computed) / self.encode_seconds if self.encode_seconds > 0 else 0.0

    def __str__(self) -> str:
        resumed = f" ({len(self.resumed)} from an interrupted run)" if self.resumed else ""
        lines = [
            f"cache {self.out_dir}: {self.samples} samples: reused {len(self.reused)}{resumed}, computed "
            f"{len(self.computed)}, dropped {self.dropped}, failed {len(self.failed)}",
            f"  shards: {self.shards_written} written, {self.shards_kept} kept, {self.shards_removed} removed; "
            f"{self.world_size} rank(s), {self.clips_per_second:.2f} clips/s encoding, {self.seconds:.1f} s in all "
            f"({self.hash_seconds:.1f} s hashing the clips, {self.verify_seconds:.1f} s verifying the cache)",
        ]
        lines += [f"  corrupt: {c}" for c in self.corrupt]
        lines += [f"  changed in place (size and mtime kept): {c}" for c in self.rewritten]
        lines += [f"  failed [{b.index}] {b.path}: {b.reason}" for b in self.failed]
        lines += [f"  {note}" for note in self.notes]
        return "\n".join(lines)


class _Ranks:
    """Rank, world size and the collectives of a run (none in one process)."""

    def __init__(self, rank: int | None, world_size: int | None) -> None:
        self.rank = int(os.environ.get("RANK", 0)) if rank is None else rank
        self.world = int(os.environ.get("WORLD_SIZE", 1)) if world_size is None else world_size
        if not 0 <= self.rank < self.world:
            raise ValueError(f"need 0 <= rank < world_size, got rank={self.rank}, world_size={self.world}")
        self.group = None
        if self.world > 1:
            if not dist.is_initialized():
                raise RuntimeError(
                    f"cache_dataset with world_size={self.world} needs torch.distributed initialized on every "
                    "rank (run it under torchrun; the apps' preprocess commands do it)"
                )
            if (dist.get_rank(), dist.get_world_size()) != (self.rank, self.world):
                raise ValueError(
                    f"rank={self.rank}, world_size={self.world} but the process group has rank "
                    f"{dist.get_rank()} of {dist.get_world_size()}"
                )
            self.group = dist.new_group(backend="gloo", timeout=BARRIER_TIMEOUT)

    def barrier(self) -> None:
        if self.group is not None:
            dist.barrier(group=self.group)

    def all_gather(self, value: Any) -> list[Any]:
        if self.group is None:
            return [value]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, value, group=self.group)
        return out

    def from_rank0(self, compute: Callable[[], Any]) -> Any:
        """:func:`from_rank0` over this run's group (``compute()`` itself in one process)."""
        return compute() if self.group is None else from_rank0(compute, self.group)


def from_rank0(compute: Callable[[], Any], group: Any) -> Any:
    """``compute()`` run on rank 0 of ``group`` alone; its result on every rank, or its exception raised on
    every rank, so that a failure there ends every rank and none waits for it (call it on every rank)."""
    payload: tuple[bool, Any] | None = None
    error: Exception | None = None
    if dist.get_rank(group) == 0:
        try:
            payload = (True, compute())
        except Exception as e:  # noqa: BLE001 - sent to the other ranks, raised here below
            error, payload = e, (False, _portable(e))
    box = [payload]
    dist.broadcast_object_list(box, group=group, group_src=0)
    if error is not None:
        raise error
    ok, value = box[0]  # type: ignore[misc]
    if not ok:
        raise value
    return value


def _portable(error: Exception) -> Exception:
    """``error`` itself when it pickles (the other ranks raise the same type), else a RuntimeError saying it."""
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:  # noqa: BLE001 - whatever does not travel is described instead
        return RuntimeError(f"rank 0: {type(error).__name__}: {error}")
    return error


def _check_dataset(dataset: Any) -> None:
    for name in ("rows", "bucket_ids", "buckets", "metadata_path", "sample", "reading_params"):
        if not hasattr(dataset, name):
            raise TypeError(
                f"cache_dataset needs a mm_data.VideoTextDataset; {type(dataset).__name__} has no {name!r}"
            )
    if dataset.frame_offset == "random":
        raise ValueError(
            "a cache holds one window per clip: read the clips with frame_offset 'start' or 'center' "
            "(a random offset would freeze one draw per clip)"
        )


def cache_dataset(
    dataset: Any,
    encode: Callable[[dict[str, Any]], Mapping[str, Any]],
    out_dir: str | Path,
    *,
    identity: Mapping[str, Any],
    recipe: Mapping[str, Any] | None = None,
    uses_prompt: bool = True,
    shard_size: int = 64,
    num_workers: int = 2,
    prefetch: int = 2,
    probe_workers: int | None = None,
    idle: Callable[[], None] | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    progress: bool = True,
) -> CacheReport:
    """Encode what ``out_dir`` does not hold yet of ``dataset`` (a :class:`~mm_data.VideoTextDataset`).

    Args:
        encode: ``encode(item) -> {name: tensor, ..., "metadata": {...}}``; ``item`` is the row's clip as
            the dataset reads it plus ``key`` and ``clip_sha256``. It must be a function of the clip, the
            row and ``identity`` (not of the row's position: that is not in the key).
        identity: What the encoders' output depends on besides the sample (weights digests, dtypes,
            options), JSON-serializable; it is hashed into every key.
        recipe: What the cache is made from in the maker's terms (``{dotted config key: value}``), recorded
            in the index for :func:`~mm_data.check_cache_made_with` (the apps: their preprocess
            section); not in the keys (``identity`` and the reading parameters are).
        uses_prompt: ``encode`` reads ``item["prompt"]`` (drawn per row): rows whose draw varies are keyed
            by their position too.
        shard_size: Samples per shard (on average; :func:`~mm_data.cache_index.shard_layout`).
        num_workers: DataLoader workers decoding clips (0: the main process).
        prefetch: Decoded clips each worker keeps ready (memory: ``num_workers * prefetch`` clips).
        probe_workers: Processes hashing clips and threads verifying the folder's files (default: the
            CPUs, at most 8).
        idle: Set when ``encode`` runs a model sharded over the ranks: called instead of ``encode`` so that
            every rank calls the model equally often (a rank with fewer rows, an undecodable clip).
        rank / world_size: default: torchrun's ``RANK`` / ``WORLD_SIZE`` (0 / 1 without it); more than one
            rank needs ``torch.distributed`` initialized.
        progress: Show a progress bar (clips/s, ETA) on rank 0.
    """
    ranks = _Ranks(rank, world_size)
    _check_dataset(dataset)
    if shard_size < 1 or num_workers < 0 or prefetch < 1:
        raise ValueError(
            f"need shard_size >= 1, num_workers >= 0, prefetch >= 1; got {shard_size}, {num_workers}, {prefetch}"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    lock = CacheLock(out)
    ranks.from_rank0(lambda: bool(lock.acquire()))  # a second run of this folder: refused on every rank
    try:
        report = _run(dataset, encode, out, ranks, identity=identity, recipe=recipe, uses_prompt=uses_prompt,
                      shard_size=shard_size, num_workers=num_workers, prefetch=prefetch,
                      probe_workers=probe_workers, idle=idle, progress=progress)  # fmt: skip
    finally:
        lock.release()  # rank 0's; nothing on the others
    report.seconds = time.perf_counter() - start
    return report


def _checked_inputs(
    dataset: Any, out: Path, ranks: _Ranks, probe_workers: int | None
) -> tuple[dict[str, Any], list[str], dict[str, str], float, float]:
    """The clips' digests (rank 0 hashes every clip), the clips changed in place, the folder's damaged
    files (each rank verifies its share) and the seconds each took: the same on every rank."""
    start = time.perf_counter()
    paths = [row["path"] for row in dataset.rows]
    records, rewritten = ranks.from_rank0(
        lambda: clip_digests(paths, metadata_path=dataset.metadata_path, workers=probe_workers)
    )
    if rewritten and hasattr(dataset, "reassign_buckets"):
        dataset.reassign_buckets()  # their probed sizes were stale too
    hashed = time.perf_counter()
    files = cache_files(out, previous_index(out))
    mine = [file for j, file in enumerate(files) if j % ranks.world == ranks.rank]
    verdicts = ranks.all_gather((verify_files(mine, probe_workers), time.perf_counter() - hashed))
    damaged = {path: why for part, _ in verdicts for path, why in part.items()}
    return records, rewritten, damaged, hashed - start, max(seconds for _, seconds in verdicts)


def _run(
    dataset: Any,
    encode: Callable[[dict[str, Any]], Mapping[str, Any]],
    out: Path,
    ranks: _Ranks,
    *,
    identity: Mapping[str, Any],
    recipe: Mapping[str, Any] | None,
    uses_prompt: bool,
    shard_size: int,
    num_workers: int,
    prefetch: int,
    probe_workers: int | None,
    idle: Callable[[], None] | None,
    progress: bool,
) -> CacheReport:
    """Check, plan, encode, pack and commit (see the module docstring), holding the folder's lock."""
    records, rewritten, damaged, hash_s, verify_s = _checked_inputs(dataset, out, ranks, probe_workers)
    plan = plan_cache(dataset, out, identity, records, damaged, uses_prompt=uses_prompt)
    mine = plan.rank_todo(ranks.rank, ranks.world)
    lockstep = max(ranks.all_gather(len(mine))) if idle is not None else None
    result = encode_rows(
        dataset, plan, mine, encode, num_workers=num_workers, prefetch=prefetch, lockstep_calls=lockstep,
        idle=idle, progress=progress, rank=ranks.rank,
    )  # fmt: skip
    ranks.barrier()  # every sample is staged
    layout, bad = _layout(plan, shard_size)
    written = _pack(plan, layout, ranks)
    ranks.barrier()  # every shard is written
    results: list[tuple[EncodeResult, list[str]]] = ranks.all_gather((result, written))
    if ranks.rank == 0:
        removed = _commit(plan, layout, bad, shard_size, made_with(dataset, identity, recipe))
    else:
        removed = []
    removed = ranks.all_gather(removed)[0]
    report = _report(plan, layout, bad, results, removed, ranks)
    report.rewritten, report.hash_seconds, report.verify_seconds = rewritten, hash_s, verify_s
    return report


def _layout(plan: CachePlan, shard_size: int) -> tuple[list[list[str]], dict[int, tuple[str, str]]]:
    """The shards of the good samples, and every bad row with its path and reason."""
    bad = dict(plan.unreadable)
    folder = plan.root / STAGING
    for row, key in enumerate(plan.keys):
        if key is None:
            continue
        marker = folder / f"{key}.bad.json"
        if key in plan.staged_bad or marker.is_file():
            bad[row] = plan.staged_bad.get(key) or _read_bad(marker)
    good = [k for row, k in enumerate(plan.keys) if k is not None and row not in bad]
    return shard_layout(list(dict.fromkeys(good)), shard_size), bad


def _read_bad(marker: Path) -> tuple[str, str]:
    data = json.loads(marker.read_text())
    return str(data["path"]), str(data["reason"])


def _keeps(plan: CachePlan, path: Path, keys: list[str]) -> bool:
    """Whether the shard file ``path`` exists as the layout wants it (same keys) and passed verification."""
    if not path.is_file() or str(path) in plan.damaged:
        return False
    previous = {s.name: s for s in plan.previous.shards} if plan.previous else {}
    listed = previous.get(path.name)
    if listed is not None and listed.bytes == path.stat().st_size:
        return True
    try:
        return set(read_shard_header(path)) == set(keys)
    except CorruptShardError:
        return False


def _pack(plan: CachePlan, layout: list[list[str]], ranks: _Ranks) -> list[str]:
    """Write this rank's shards of ``layout`` that do not exist yet; return their names."""
    reader = ShardReader(max_open=8)
    written = []
    for j, keys in enumerate(layout):
        if j % ranks.world != ranks.rank:
            continue
        path = plan.root / shard_name(keys)
        if _keeps(plan, path, keys):
            continue
        samples = []
        for key in keys:
            where = plan.available.get(key) or Location(staged_file(plan.root, key), staged=True)
            tensors, meta = reader.read(where.path, key)
            samples.append((key, tensors, meta))
        write_shard(path, samples)
        written.append(path.name)
        kill_hook("packed", len(written))
    return written


def _commit(
    plan: CachePlan,
    layout: list[list[str]],
    bad: dict[int, tuple[str, str]],
    shard_size: int,
    record: dict[str, Any],
) -> list[str]:
    """Write the index (atomically) with ``record`` (how the cache was made), then remove unlisted shards,
    temporaries and the staging folder."""
    shards = []
    for keys in layout:
        name = shard_name(keys)
        shards.append(ShardEntry(name, (plan.root / name).stat().st_size, keys))
    keys = [None if row in bad else key for row, key in enumerate(plan.keys)]
    index = CacheIndex(len(plan.keys), plan.bucket_ids, keys, shards, bad, shard_size, record)
    index.save(plan.root)
    listed = {s.name for s in shards}
    removed = []
    for path in sorted(plan.root.glob("shard-*.safetensors")):
        if path.name not in listed:
            path.unlink()
            removed.append(path.name)
    for path in plan.root.glob(".*.tmp*"):
        path.unlink(missing_ok=True)  # temporaries of an interrupted write
    shutil.rmtree(plan.root / STAGING, ignore_errors=True)
    return removed


def _report(
    plan: CachePlan,
    layout: list[list[str]],
    bad: dict[int, tuple[str, str]],
    results: list[tuple[EncodeResult, list[str]]],
    removed: list[str],
    ranks: _Ranks,
) -> CacheReport:
    computed_rows = sorted(r for result, _ in results for r in result.computed)
    computed_keys = {plan.keys[r] for r in computed_rows}
    good = [(row, key) for row, key in enumerate(plan.keys) if key is not None and row not in bad]
    new_keys = {key for _, key in good}
    resumed = plan.resumed
    written = [name for _, names in results for name in names]
    report = CacheReport(str(plan.root), ranks.rank, ranks.world, len(plan.keys))
    report.computed = [row for row, key in good if key in computed_keys]
    report.reused = [row for row, key in good if key not in computed_keys]
    report.resumed = [row for row in report.reused if plan.keys[row] in resumed]
    report.failed = [BadSample(row, *bad[row]) for row in sorted(bad)]
    report.dropped = len(set(plan.previous.shard_of) - new_keys) if plan.previous else 0
    report.corrupt = _corrupt_lines(plan)
    report.shards_written, report.shards_removed = len(written), len(removed)
    report.shards_kept = len(layout) - len(written)
    report.encode_seconds = max(result.seconds for result, _ in results)
    return report


def _corrupt_lines(plan: CachePlan) -> list[str]:
    """Each file that failed verification: its path, why, and the rows it held (encoded again)."""
    lines = [f"{e.path}: {e.reason}; its rows {e.samples} are encoded again" for e in plan.corrupt]
    listed = {e.path for e in plan.corrupt}
    lines += [
        f"{path}: {why}; its samples are encoded again"
        for path, why in plan.damaged.items()
        if path not in listed
    ]
    return lines
