"""Atomic, resharding-capable training checkpoints on torch DCP.

Layout under ``root``: ``iter_NNNNNNN/`` (DCP files + ``rank_state/dp_rank_NNNNN.pt`` +
``mm_checkpoint.json``) and the tracker ``latest_checkpointed_iteration.txt``. A save writes
``iter_NNNNNNN.partial/``, renames it into place, then atomically replaces the tracker, so a crash at
any point leaves the previous checkpoint and tracker intact. A background save
(``save(background=True)``, :mod:`.background_save`) stages the state in host memory, returns, and
commits the same way once its files are complete (:meth:`DistributedCheckpointer.finish_pending`);
at most one is in flight. A save that fails (sync or background) removes its ``iter_*.partial``.
Retention (``keep_last``, ``keep_every``) deletes old ``iter_*`` dirs of this root only after the new
one is committed, and never one that the retention rule it was saved under still keeps (a milestone of
an earlier ``keep_every``) unless ``prune_kept=True``.

Integrity: every save records a CRC-32 of each DCP storage item (:mod:`.checksums`), and a load checks
each item it reads against it (``verify=False`` skips that); the per-rank state files are zip archives
whose records' CRC-32 are checked too. A corrupted checkpoint is a
:class:`~mm_checkpoint.errors.CheckpointIntegrityError` naming the file, the tensor and the iteration,
and which earlier checkpoint to resume instead.

Per-rank state (every entry that is not model / optimizer / scheduler, e.g. the data position) is
written once per data-parallel rank, holding only tensors and plain Python values, and read back
with ``torch.load(weights_only=True)``: a file that would need anything else to unpickle is refused
with an error naming it, and runs no code. A load at the saved data-parallel size restores each
rank's own file; at another size every rank reads all saved files and the entry merges them
(``load_rank_states``), so no rank starts over for lack of a file of its own.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import threading
import time
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from .background_save import PendingSave, staging_copier
from .checksums import ChecksummingWriter
from .errors import CheckpointError, CheckpointIntegrityError, CheckpointLoadError, CheckpointNotFoundError
from .info_file import INFO_FILENAME, SUBMODELS_INFO_KEY, read_info
from .layout import (
    RELEASE_ITERATION,
    TRACKER_FILENAME,
    iteration_dir_name,
    latest_iteration,
    read_tracker,
    resolve_dcp_dir,
    valid_iterations,
    write_tracker,
)
from .restricted_dcp import RestrictedFileSystemReader, read_dcp_metadata, restricted_dcp_load
from .runtime import barrier, get_rank, get_world_size, is_distributed, on_rank0, single_process_quiet
from .zip_files import check_zip_crcs, zip_damage

DCP_KEYS = ("model", "optimizer", "lr_scheduler", "ema")
"""State entries stored through DCP (resharded on load); every other entry is per data-parallel rank.
``ema`` is an object whose ``state_dict()`` maps model keys to tensors or DTensors (the EMA of the
trainable parameters: sharded like them, so resharded like them)."""
RANK_STATE_DIR = "rank_state"
DELETING_SUFFIX = ".deleting"
"""An ``iter_*`` dir that retention is deleting (renamed first: it no longer counts as a checkpoint)."""
CHECKSUMS_INFO_KEY = "checksums"
"""Key of ``mm_checkpoint.json``: ``"crc32"`` when the save wrote digests (a load then requires them)."""
RETENTION_INFO_KEY = "retention"
"""Key of ``mm_checkpoint.json``: the ``{"keep_last", "keep_every"}`` the checkpoint was saved under."""
WITHDRAWN_SUFFIX = ".withdrawn"
"""An ``iter_*`` dir that :meth:`DistributedCheckpointer.withdraw` moved aside (no older one was left for
the tracker): it no longer counts as a checkpoint, and stays on disk for a look."""


@dataclass(frozen=True)
class Withdrawal:
    """What :meth:`DistributedCheckpointer.withdraw` did: the iterations it stopped naming as the latest,
    the iteration the tracker names now (None: no tracker left), whether they were moved aside."""

    withdrawn: tuple[int, ...]
    tracked: int | None
    moved_aside: bool = False

    def describe(self, root: Path) -> str:
        """The outcome in words: which checkpoint to resume, which not."""
        if not self.withdrawn:
            return f"no checkpoint of {root} was withdrawn"
        names = ", ".join(iteration_dir_name(it) for it in self.withdrawn)
        if self.tracked is not None:
            return (
                f"resume from iteration {self.tracked} ({root / iteration_dir_name(self.tracked)}, which the tracker "
                f"now names), not from {names}"
            )
        aside = f" (moved aside as *{WITHDRAWN_SUFFIX})" if self.moved_aside else ""
        return f"{root} holds no earlier checkpoint to resume: start over; do not resume {names}{aside}"


logger = logging.getLogger(__name__)


class RNGState:
    """Per-rank state entry capturing/restoring Python, torch (CPU and accelerator) and numpy RNG state.

    The state holds tensors and plain values only (numpy's key array as a tensor), so that it loads
    with ``torch.load(weights_only=True)``.
    """

    def state_dict(self) -> dict[str, Any]:
        version, internal, gauss = random.getstate()
        state: dict[str, Any] = {"python": [version, list(internal), gauss], "torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state_all()
        try:
            import numpy as np

            kind, keys, pos, has_gauss, cached = np.random.get_state()
            state["numpy"] = [
                kind,
                torch.from_numpy(keys.astype(np.int64)),
                int(pos),
                int(has_gauss),
                float(cached),
            ]
        except ImportError:
            pass
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
        torch.set_rng_state(state["torch"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])
        if "numpy" in state:
            import numpy as np

            kind, keys, pos, has_gauss, cached = state["numpy"]
            np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))


def _optimizers(state: Mapping[str, Any]) -> tuple[torch.optim.Optimizer, ...]:
    opt = state.get("optimizer")
    if opt is None:
        return ()
    return tuple(opt) if isinstance(opt, (list, tuple)) else (opt,)


def _dcp_state(state: Mapping[str, Any], *, saving: bool = False) -> dict[str, Any]:
    """The DCP entries of ``state``. ``saving``: an optimizer that has never stepped is saved without
    state (``get_state_dict`` would give it one by a zero-lr step, changing its step count)."""
    out: dict[str, Any] = {}
    model: nn.Module | None = state.get("model")
    optims = _optimizers(state)
    if model is not None:
        unstepped = [o for o in optims if not o.state] if saving else []
        model_sd, optim_sd = get_state_dict(model, optims)
        if unstepped:
            _forget_initial_state(optims, unstepped, optim_sd)
        out["model"] = model_sd
        if optims:
            out["optimizer"] = optim_sd
    elif optims:
        raise ValueError("checkpoint state has an 'optimizer' but no 'model'")
    for key in ("lr_scheduler", "ema"):
        if state.get(key) is not None:
            out[key] = state[key].state_dict()
    return out


def _forget_initial_state(
    optims: Sequence[torch.optim.Optimizer], unstepped: list[torch.optim.Optimizer], optim_sd: dict[str, Any]
) -> None:
    """Undo what ``get_state_dict`` did to the optimizers in ``unstepped`` (a zero-lr step that gave them
    state): their state is cleared again, and their parameters' entries leave ``optim_sd``, whose param
    groups come in the optimizers' order."""
    start = 0
    for optim in optims:
        groups = optim_sd["param_groups"][start : start + len(optim.param_groups)]
        start += len(optim.param_groups)
        if any(optim is o for o in unstepped):
            for group in groups:
                for fqn in group["params"]:
                    optim_sd["state"].pop(fqn, None)
            optim.state.clear()


def _drop_unstepped(dcp_state: dict[str, Any], stored: Mapping[str, Any]) -> bool:
    """Take out of a load's ``optimizer`` entry the parameters of which the checkpoint holds no state
    at all (their optimizer had not stepped them when it was saved): they load without state, as they
    were. A parameter with part of its state stored stays, so that the part missing is an error. Whether
    any was taken out."""
    state = (dcp_state.get("optimizer") or {}).get("state") or {}
    dropped = [
        fqn
        for fqn, entry in state.items()
        if isinstance(entry, Mapping) and not any(f"optimizer.state.{fqn}.{k}" in stored for k in entry)
    ]
    for fqn in dropped:
        del state[fqn]
    return bool(dropped)


def _per_rank_state(state: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in state.items():
        if key in DCP_KEYS or value is None:
            continue
        out[key] = value.state_dict() if hasattr(value, "state_dict") else dict(value)
    return out


def _restore_per_rank(state: MutableMapping[str, Any], saved: Mapping[str, Any]) -> None:
    for key, value in state.items():
        if key in DCP_KEYS or value is None or key not in saved:
            continue
        if hasattr(value, "load_state_dict"):
            value.load_state_dict(saved[key])
        elif isinstance(value, MutableMapping):
            value.clear()
            value.update(saved[key])
        else:
            state[key] = saved[key]


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def checkpoint_info(root: str | os.PathLike, iteration: int | None = None) -> dict[str, Any]:
    """What a save recorded about itself (``iteration``, ``world_size``, ``dp_size``, ``time``);
    ``iteration`` defaults to the tracker's (or the single valid one)."""
    path, _ = resolve_dcp_dir(root, iteration)
    info = read_info(path)
    if info is None:
        raise CheckpointNotFoundError(
            f"{path} has no {INFO_FILENAME}: not written by DistributedCheckpointer"
        )
    return info


class DistributedCheckpointer:
    """Save and load model / optimizer / LR scheduler / per-rank state under ``root``.

    Args:
        root: checkpoint root directory.
        keep_last: keep only this many newest ``iter_*`` checkpoints (None keeps all).
        keep_every: also keep every checkpoint whose iteration is a multiple of this (None: none extra).
        dp_rank / dp_size: data-parallel coordinates keying per-rank state (default: global rank / world).
        background_group: the process group of background saves' collectives (a gloo group of every
            rank, apart from the training's). Required by ``save(background=True)`` in a multi-rank
            run (refused without it).
        verify: check the CRC-32 of every storage item a load reads (default); False skips it.
        prune_kept: let retention delete checkpoints that the rule they were saved under keeps (an
            earlier ``keep_every``'s milestones, an earlier larger ``keep_last``); False (default) keeps
            them, logged.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        keep_last: int | None = None,
        *,
        keep_every: int | None = None,
        dp_rank: int | None = None,
        dp_size: int | None = None,
        background_group: Any = None,
        verify: bool = True,
        prune_kept: bool = False,
    ) -> None:
        for name, value in (("keep_last", keep_last), ("keep_every", keep_every)):
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 or None, got {value}")
        self.root = Path(root)
        self.keep_last = keep_last
        self.keep_every = keep_every
        self.dp_rank = get_rank() if dp_rank is None else dp_rank
        self.dp_size = get_world_size() if dp_size is None else dp_size
        self.background_group = background_group
        self.verify = verify
        self.prune_kept = prune_kept
        self._reported_kept: set[int] = set()
        self.pending: PendingSave | None = None
        """The background save in flight, None when there is none."""
        self._stager: Any = None
        self._deleting: threading.Thread | None = None
        self.staging_bytes = 0
        """Host memory a background save stages on this rank (known after the first one)."""

    def latest_iteration(self) -> int | None:
        """Iteration the tracker (or the single valid dir) points at, None if there is none."""
        return latest_iteration(self.root)

    def save(
        self,
        state: Mapping[str, Any],
        iteration: int,
        *,
        info: Mapping[str, Any] | None = None,
        submodels: Sequence[str] | None = None,
        background: bool = False,
    ) -> Path:
        """Collectively save ``state`` as ``iteration``; returns the final directory. Call on every rank.

        ``info`` (rank 0's, JSON-serializable) is added to the iteration's ``mm_checkpoint.json``, so it
        becomes visible atomically with the tensors (see :func:`checkpoint_info`). ``submodels`` names
        the top-level modules of a container model (``predictor``...): recorded as ``submodels``, they
        make export and ``mm-ckpt convert`` ask which one to write.

        ``background``: return once the state is staged in host memory and the per-rank state written;
        the DCP files are written by a thread (:attr:`pending`) and the directory appears, with the
        tracker, when :meth:`finish_pending` (or :meth:`check_pending` after the write ended) commits
        it. A background save still in flight is finished first (at most one at a time).
        """
        if background and is_distributed() and self.background_group is None:
            raise ValueError(
                "a background save in a multi-rank run needs DistributedCheckpointer(background_group=...): a "
                "gloo group of every rank apart from the training's (its collectives run in another thread)"
            )
        self.finish_pending()
        info = {
            **(info or {}),
            CHECKSUMS_INFO_KEY: "crc32",
            RETENTION_INFO_KEY: {"keep_last": self.keep_last, "keep_every": self.keep_every},
        }
        if submodels is not None:
            info[SUBMODELS_INFO_KEY] = list(submodels)
        self._check_forward(iteration)
        final = self.root / iteration_dir_name(iteration)
        partial = final.with_name(final.name + ".partial")
        if get_rank() == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir()
        barrier()
        if background:
            future = self._start_background_write(state, partial)
        else:
            try:
                with single_process_quiet():
                    dcp.save(
                        _dcp_state(state, saving=True),
                        storage_writer=ChecksummingWriter(str(partial)),
                        no_dist=not is_distributed(),
                    )
                self._save_per_rank(state, partial)
                barrier()
            except BaseException:
                _discard(partial)  # no collective: every rank raises on its own
                raise

        def commit() -> None:
            if get_rank() == 0:
                self._write_info(partial, iteration, info)
                self._commit(partial, final, iteration)
                self._prune(iteration, background)

        if background:
            self._save_per_rank(state, partial)
            barrier()
            self.pending = PendingSave(iteration, partial, future, commit, lambda: _discard(partial))
            return final
        commit()
        barrier()
        return final

    def _start_background_write(self, state: Mapping[str, Any], partial: Path) -> Any:
        """Stage ``state`` into host memory (returns once staged) and write it from a thread: the future."""
        dcp_state = _dcp_state(state, saving=True)
        if self._stager is None:
            self._stager = staging_copier()
            self.staging_bytes = local_tensor_bytes(dcp_state)
            logger.info(
                "background saves of %s stage %.2f GiB per rank in host memory",
                self.root,
                self.staging_bytes / 2**30,
            )
        with single_process_quiet():
            return dcp.async_save(
                dcp_state,
                storage_writer=ChecksummingWriter(str(partial)),
                process_group=self.background_group,
                async_stager=self._stager,
                no_dist=not is_distributed(),
            )

    def withdraw(self, since: int) -> Withdrawal:
        """Stop naming the checkpoints of iteration ``since`` and later as the latest: the tracker moves
        back to the newest one before ``since``; with none left, they are renamed aside
        (``iter_*.withdrawn``) and the tracker removed, so that no resume picks them. A background save in
        flight is committed first. Collective (rank 0 acts; every rank gets its :class:`Withdrawal`)."""
        self.finish_pending()
        return on_rank0(lambda: self._withdraw(since))

    def _withdraw(self, since: int) -> Withdrawal:
        found = {it: p for it, p in valid_iterations(self.root).items() if it != RELEASE_ITERATION}
        withdrawn = tuple(it for it in found if it >= since)
        older = [it for it in found if it < since]
        if not withdrawn:
            return Withdrawal((), read_tracker(self.root))
        if older:
            write_tracker(self.root, older[-1])
            return Withdrawal(withdrawn, older[-1])
        for it in withdrawn:
            os.replace(found[it], found[it].with_name(found[it].name + WITHDRAWN_SUFFIX))
        (self.root / TRACKER_FILENAME).unlink(missing_ok=True)
        return Withdrawal(withdrawn, None, moved_aside=True)

    def check_pending(self) -> None:
        """Commit the background save if its write has ended; raise its error if it failed. Never waits
        and makes no collective (ranks may see the end at different steps)."""
        if self.pending is not None and self.pending.done():
            pending, self.pending = self.pending, None
            pending.finish()

    def finish_pending(self, timeout_s: float | None = None) -> None:
        """Wait (at most ``timeout_s``) for the background save in flight and commit it, and for the
        deletion of the checkpoints its retention dropped; no-op without either.

        Raises:
            CheckpointError: the background write failed, or did not end in time.
        """
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.finish(timeout_s)
        if self._deleting is not None:
            self._deleting.join()
            self._deleting = None

    def _save_per_rank(self, state: Mapping[str, Any], partial: Path) -> None:
        dp_ranks = [self.dp_rank] * get_world_size()
        if is_distributed():
            torch.distributed.all_gather_object(dp_ranks, self.dp_rank)
        if dp_ranks.index(self.dp_rank) != get_rank():
            return  # a lower global rank with the same dp rank writes it (identical within a CP group)
        per_rank = _per_rank_state(state)
        if not per_rank:
            return
        for key, value in per_rank.items():
            _check_plain(value, f"per-rank state entry {key!r}")
        out = partial / RANK_STATE_DIR
        out.mkdir(exist_ok=True)
        path = out / _rank_state_name(self.dp_rank)
        torch.save({"dp_rank": self.dp_rank, "dp_size": self.dp_size, "state": per_rank}, path)
        _fsync_file(path)  # a zip archive: each record's CRC-32 is in it (checked on load)

    def _write_info(self, partial: Path, iteration: int, extra: Mapping[str, Any]) -> None:
        info = {
            **extra,
            "iteration": iteration,
            "world_size": get_world_size(),
            "dp_size": self.dp_size,
            "time": time.time(),
        }
        (partial / INFO_FILENAME).write_text(json.dumps(info, indent=2) + "\n")
        _fsync_file(partial / INFO_FILENAME)

    def _commit(self, partial: Path, final: Path, iteration: int) -> None:
        replaced = final.with_name(final.name + ".replaced")
        if final.exists():
            shutil.rmtree(replaced, ignore_errors=True)
            os.replace(final, replaced)
        os.replace(partial, final)
        write_tracker(self.root, iteration)
        shutil.rmtree(replaced, ignore_errors=True)

    def _check_forward(self, iteration: int) -> None:
        """Refuse (on every rank, before any collective) to move the tracker back: a lower iteration than
        the tracker's belongs to another run, whose checkpoints this save would replace or prune."""
        tracked = read_tracker(self.root)
        if tracked is not None and tracked != RELEASE_ITERATION and iteration < tracked:
            raise CheckpointError(
                f"{self.root} already holds iteration {tracked} (its tracker); saving iteration {iteration} "
                "there would move the tracker back and mix two runs: resume that run, or save elsewhere"
            )

    def _prune(self, iteration: int, background: bool = False) -> None:
        """Delete the iterations up to ``iteration`` that the retention rule does not keep (newer ones
        are not this run's): see :func:`retained`. Each is first renamed to ``iter_*.deleting`` (one
        atomic rename: never a half-deleted dir that still looks like a checkpoint), then removed; after
        a background save by a thread that :meth:`finish_pending` joins, so training does not wait for
        the deletion. Leftovers of an interrupted deletion are removed by the next prune."""
        if self.keep_last is None:
            return
        iters = {
            it: p
            for it, p in valid_iterations(self.root).items()
            if it != RELEASE_ITERATION and it <= iteration
        }
        kept = retained(list(iters), keep_last=self.keep_last, keep_every=self.keep_every)
        held = []
        for it, path in iters.items():
            if it in kept:
                continue
            if not self.prune_kept and it in _kept_by_own_rule(path, list(iters)):
                held.append(it)
                continue
            os.replace(path, path.with_name(path.name + DELETING_SUFFIX))
        self._report_held(held)
        doomed = sorted(self.root.glob(f"iter_*{DELETING_SUFFIX}"))
        if not background:
            _remove_all(doomed)
        elif doomed:
            self._deleting = threading.Thread(
                target=_remove_all, args=(doomed,), name="retention", daemon=True
            )
            self._deleting.start()

    def _report_held(self, held: list[int]) -> None:
        """Log (once each) the checkpoints retention kept because the rule they were saved under keeps them."""
        new = [it for it in held if it not in self._reported_kept]
        if not new:
            return
        self._reported_kept.update(new)
        logger.warning(
            "%s: keeping %s although keep_last=%s, keep_every=%s would delete them: the retention they were "
            "saved under keeps them (an earlier keep_every's milestones, or a larger keep_last). Deleting them "
            "takes the command line's --prune-kept-checkpoints (DistributedCheckpointer(prune_kept=True))",
            self.root, [iteration_dir_name(it) for it in new], self.keep_last, self.keep_every,
        )  # fmt: skip

    def load(self, state: MutableMapping[str, Any], iteration: int | None = None) -> int:
        """Collectively restore ``state`` in place from ``iteration`` (default: tracker / single valid dir).

        Returns the iteration loaded. Works at a different world size or sharding (DCP reshards).

        Raises:
            CheckpointNotFoundError / AmbiguousCheckpointError: nothing or several things to load.
            CheckpointLoadError: the checkpoint lacks an entry that ``state`` asks for.
            CheckpointIntegrityError: a file of the checkpoint is corrupted (with ``verify``: a storage
                item's CRC-32; always: a damaged per-rank state archive), naming the file, the tensor,
                the iteration and the previous checkpoint to resume instead.
        """
        path, it = resolve_dcp_dir(self.root, iteration)
        if it is None:
            raise CheckpointNotFoundError(
                f"{self.root} is a bare DCP dir, not a checkpoint root with iter_* dirs"
            )
        try:
            self._load(state, path)
        except CheckpointIntegrityError as err:
            raise self._corrupted(err, it) from None
        return it

    def _load(self, state: MutableMapping[str, Any], path: Path) -> None:
        dcp_state = _dcp_state(state)
        stored = self._check_entries(path, dcp_state)
        unstepped = _drop_unstepped(dcp_state, stored)
        required = (read_info(path) or {}).get(CHECKSUMS_INFO_KEY) == "crc32"
        reader = RestrictedFileSystemReader(str(path), verify=self.verify, required_checksums=required)
        restricted_dcp_load(dcp_state, path, reader=reader, no_dist=not is_distributed())
        model = state.get("model")
        if model is not None:
            set_model_state_dict(model, dcp_state["model"])
            if _optimizers(state):  # parameters saved without optimizer state load without it
                set_optimizer_state_dict(
                    model,
                    _optimizers(state),
                    dcp_state["optimizer"],
                    options=StateDictOptions(strict=not unstepped),
                )
        for key in ("lr_scheduler", "ema"):
            if state.get(key) is not None:
                state[key].load_state_dict(dcp_state[key])
        self._load_per_rank(state, path)

    def _corrupted(self, err: CheckpointIntegrityError, iteration: int) -> CheckpointIntegrityError:
        """``err`` with the iteration, and which checkpoint to resume instead."""
        older = [it for it in valid_iterations(self.root) if 0 <= it < iteration]
        tracker = self.root / TRACKER_FILENAME
        if older:
            prev = older[-1]
            advice = (
                f"Resume from the previous checkpoint, iteration {prev} ({self.root / iteration_dir_name(prev)}): "
                f"write {prev} into {tracker} (a resume reads the iteration it names), or start a run from that "
                f"directory; do not resume iteration {iteration}"
            )
        else:
            advice = (
                f"{self.root} holds no earlier checkpoint to resume instead: start over, or restore the file"
            )
        return CheckpointIntegrityError(
            f"checkpoint iteration {iteration} is corrupted: {err}. {advice}",
            path=err.path, key=err.key, iteration=iteration,
        )  # fmt: skip

    def _check_entries(self, path: Path, dcp_state: Mapping[str, Any]) -> Mapping[str, Any]:
        """The checkpoint's stored keys, once every top-level entry of ``dcp_state`` is known there."""
        stored = read_dcp_metadata(path).state_dict_metadata
        tops = {k.split(".", 1)[0] for k in stored}
        absent = [k for k in dcp_state if k not in tops]
        if absent:
            raise CheckpointLoadError(f"checkpoint {path} has no {absent} state (it holds {sorted(tops)})")
        return stored

    def _load_per_rank(self, state: MutableMapping[str, Any], path: Path) -> None:
        """Restore every per-rank entry of ``state``: from this rank's own file at the saved dp size,
        else from all saved ranks' files through the entry's ``load_rank_states``. An entry that no saved
        file holds is an error, unless the entry says ``optional_rank_state = True`` (it stays as it is)."""
        wanted = [k for k, v in state.items() if k not in DCP_KEYS and v is not None]
        if not wanted:
            return
        info = read_info(path, required=("dp_size",))
        if info is None:
            raise CheckpointLoadError(
                f"{path} has no {INFO_FILENAME}: the data-parallel size its per-rank state {wanted} was saved at "
                "is unknown"
            )
        saved_dp = info["dp_size"]
        same_layout = saved_dp == self.dp_size
        ranks = [self.dp_rank] if same_layout else list(range(saved_dp))
        files = [path / RANK_STATE_DIR / _rank_state_name(r) for r in ranks]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise CheckpointLoadError(
                f"checkpoint {path} (saved at data-parallel size {saved_dp}) lacks per-rank state {missing}: "
                f"{wanted} cannot be restored"
            )
        saved = [_read_rank_state(f, verify=self.verify)["state"] for f in files]
        for key in wanted:
            absent = [str(f) for f, s in zip(files, saved) if key not in s]
            if len(absent) == len(files) and getattr(state[key], "optional_rank_state", False):
                continue  # an entry the saving run did not have: it stays as it is (the entry's choice)
            if absent:
                raise CheckpointLoadError(f"per-rank state {absent} holds no {key!r} entry")
            try:
                self._restore_entry(state, key, [s[key] for s in saved], same_layout, saved_dp)
            except (ValueError, KeyError, TypeError) as err:
                raise CheckpointLoadError(f"{key!r} from {[str(f) for f in files]}: {err}") from err

    def _restore_entry(
        self, state: MutableMapping[str, Any], key: str, saved: list[Any], same_layout: bool, saved_dp: int
    ) -> None:
        value = state[key]
        if same_layout:
            _restore_per_rank(state, {key: saved[0]})
        elif callable(getattr(value, "load_rank_states", None)):
            value.load_rank_states(saved, dp_rank=self.dp_rank, dp_size=self.dp_size)
        else:
            raise CheckpointLoadError(
                f"{key!r} was saved per data-parallel rank at dp size {saved_dp}; loading it at dp size "
                f"{self.dp_size} needs {type(value).__name__}.load_rank_states(states, dp_rank=, dp_size=)"
            )


def _discard(partial: Path) -> None:
    """Remove the ``iter_*.partial`` of a save that failed (rank 0, which made it; never raises)."""
    if get_rank() == 0:
        shutil.rmtree(partial, ignore_errors=True)


def _kept_by_own_rule(path: Path, iterations: list[int]) -> set[int]:
    """The iterations the retention recorded in ``path``'s ``mm_checkpoint.json`` keeps among
    ``iterations``; empty when it recorded none (a save before retention was recorded)."""
    try:
        rule = (read_info(path) or {}).get(RETENTION_INFO_KEY)
    except CheckpointError:
        return set()
    if not isinstance(rule, dict):
        return set()
    last, every = rule.get("keep_last"), rule.get("keep_every")
    if not all(
        v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 1) for v in (last, every)
    ):
        return set()
    return retained(iterations, keep_last=last, keep_every=every)


def _remove_all(paths: Sequence[Path]) -> None:
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


def local_tensor_bytes(tree: Any) -> int:
    """Bytes of this rank's tensors in a nested state (a DTensor counts its local shard): what staging
    it copies into host memory."""
    if isinstance(tree, torch.Tensor):
        local = tree.to_local() if hasattr(tree, "to_local") else tree
        return local.numel() * local.element_size()
    if isinstance(tree, Mapping):
        return sum(local_tensor_bytes(v) for v in tree.values())
    if isinstance(tree, (list, tuple)):
        return sum(local_tensor_bytes(v) for v in tree)
    return 0


def retained(iterations: Sequence[int], *, keep_last: int | None, keep_every: int | None = None) -> set[int]:
    """The iterations a retention rule keeps: the ``keep_last`` highest (all when None), and every
    multiple of ``keep_every``."""
    ordered = sorted(iterations)
    kept = set(ordered if keep_last is None else ordered[-keep_last:])
    if keep_every is not None:
        kept |= {it for it in ordered if it % keep_every == 0}
    return kept


def _rank_state_name(dp_rank: int) -> str:
    """File name of one data-parallel rank's state under ``iter_*/rank_state/``."""
    return f"dp_rank_{dp_rank:05d}.pt"


def _read_rank_state(path: str | os.PathLike, *, verify: bool = True) -> dict[str, Any]:
    """One per-rank state file, unpickled with ``weights_only=True`` (tensors and plain values only);
    with ``verify`` each of its zip records is checked against its CRC-32 first.

    Raises:
        CheckpointIntegrityError: the file is truncated, its zip structure damaged, or (``verify``) a
            record's bytes changed.
        CheckpointLoadError: the file needs anything else to load (a crafted or foreign pickle: nothing
            in it runs), or is not a per-rank state file.
    """
    if verify:
        check_zip_crcs(path)
    elif (damage := zip_damage(path)) is not None:
        raise CheckpointIntegrityError(f"{path}: {damage}", path=Path(path))
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - UnpicklingError, RuntimeError, EOFError...: all mean "refused"
        if (damage := zip_damage(path)) is not None or "PytorchStreamReader" in str(err):
            raise CheckpointIntegrityError(
                f"{path}: {damage or 'its zip structure is corrupted'}", path=Path(path)
            ) from None
        raise CheckpointLoadError(
            f"{path}: not loadable as per-rank state with torch.load(weights_only=True) (only tensors and "
            f"plain values are accepted): {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        ) from err
    if not isinstance(saved, dict) or not isinstance(saved.get("state"), dict):
        raise CheckpointLoadError(f"{path}: not a per-rank state file (expected a dict with a 'state' dict)")
    return saved


_PLAIN = (str, int, float, bool, type(None), torch.Tensor)


def _check_plain(value: Any, what: str) -> None:
    """Refuse at save time what ``torch.load(weights_only=True)`` would refuse at load time."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, (str, int)):
                raise TypeError(
                    f"{what}: key {k!r} is a {type(k).__name__}; per-rank state keys are str or int"
                )
            _check_plain(v, f"{what}[{k!r}]")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_plain(v, f"{what}[{i}]")
    elif not isinstance(value, _PLAIN):
        raise TypeError(
            f"{what} is a {type(value).__name__}: per-rank state holds only tensors, dicts, lists, tuples, "
            "str, int, float, bool and None (it is loaded with torch.load(weights_only=True))"
        )
