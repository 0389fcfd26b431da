"""DistributedCheckpointer: round trip of training state, tracker, discovery, pruning and crash safety."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from mm_checkpoint import (
    TRACKER_FILENAME,
    AmbiguousCheckpointError,
    CheckpointError,
    CheckpointLoadError,
    CheckpointNotFoundError,
    DistributedCheckpointer,
    RNGState,
    latest_iteration,
)
from torch import nn


def _training_state(seed: int) -> dict:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.9**step)
    return {"model": model, "optimizer": opt, "lr_scheduler": sched, "dataloader": {"epoch": 0, "index": 0}}


def _train(state: dict, steps: int) -> None:
    for _ in range(steps):
        loss = state["model"](torch.randn(3, 4)).square().mean()
        loss.backward()
        state["optimizer"].step()
        state["optimizer"].zero_grad()
        state["lr_scheduler"].step()
        state["dataloader"]["index"] += 3


def test_round_trip_restores_model_optimizer_scheduler_dataloader_and_rng(tmp_path: Path) -> None:
    saved = _training_state(0)
    _train(saved, 3)
    ckpt = DistributedCheckpointer(tmp_path)
    ckpt.save({**saved, "rng": RNGState()}, iteration=3)
    expected_draw = torch.rand(4)

    restored = _training_state(1)
    torch.manual_seed(123)
    assert ckpt.load({**restored, "rng": RNGState()}) == 3
    assert torch.equal(torch.rand(4), expected_draw)
    for a, b in zip(saved["model"].parameters(), restored["model"].parameters()):
        assert torch.equal(a, b)
    sa, sb = saved["optimizer"].state_dict()["state"], restored["optimizer"].state_dict()["state"]
    assert all(torch.equal(sa[i]["exp_avg"], sb[i]["exp_avg"]) for i in sa)
    assert (
        restored["lr_scheduler"].last_epoch == 3
        and restored["lr_scheduler"].get_last_lr() == saved["lr_scheduler"].get_last_lr()
    )
    assert restored["dataloader"] == {"epoch": 0, "index": 9}


def test_tracker_names_latest_save_and_keep_last_prunes(tmp_path: Path) -> None:
    state = _training_state(0)
    ckpt = DistributedCheckpointer(tmp_path, keep_last=2)
    for it in (1, 2, 3):
        ckpt.save(state, it)
    assert (tmp_path / TRACKER_FILENAME).read_text().strip() == "3"
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["iter_0000002", "iter_0000003"]
    assert latest_iteration(tmp_path) == 3


def test_saving_below_the_tracker_is_refused_and_touches_nothing(tmp_path: Path) -> None:
    ckpt = DistributedCheckpointer(tmp_path, keep_last=1)
    ckpt.save(_training_state(0), 30)
    with pytest.raises(CheckpointError, match=r"already holds iteration 30 .*move the tracker back"):
        ckpt.save(_training_state(0), 10)
    assert (tmp_path / TRACKER_FILENAME).read_text().strip() == "30"
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["iter_0000030"]


def test_keep_last_counts_only_iterations_up_to_the_save(tmp_path: Path) -> None:
    ckpt = DistributedCheckpointer(tmp_path, keep_last=2)
    ckpt.save(_training_state(0), 30)
    (tmp_path / TRACKER_FILENAME).unlink()  # another run's iteration 30, its tracker gone
    ckpt.save(_training_state(0), 10)
    ckpt.save(_training_state(0), 20)  # keeps 10 and 20: 30 is not one of this run's two
    dirs = sorted(p.name for p in tmp_path.iterdir() if p.is_dir())
    assert dirs == ["iter_0000010", "iter_0000020", "iter_0000030"]


def test_without_tracker_the_single_valid_iteration_is_loaded(tmp_path: Path) -> None:
    DistributedCheckpointer(tmp_path).save(_training_state(0), 5)
    (tmp_path / TRACKER_FILENAME).unlink()
    (tmp_path / "iter_0000009").mkdir()  # empty: an interrupted save, not a candidate
    assert DistributedCheckpointer(tmp_path).load(_training_state(1)) == 5


def test_two_valid_iterations_without_tracker_is_ambiguous(tmp_path: Path) -> None:
    ckpt = DistributedCheckpointer(tmp_path)
    ckpt.save(_training_state(0), 1)
    ckpt.save(_training_state(0), 2)
    (tmp_path / TRACKER_FILENAME).unlink()
    with pytest.raises(AmbiguousCheckpointError, match=r"iter_0000001, iter_0000002"):
        ckpt.load(_training_state(1))


def test_no_valid_checkpoint_names_the_directory(tmp_path: Path) -> None:
    (tmp_path / "iter_0000000").mkdir()
    with pytest.raises(CheckpointNotFoundError, match=str(tmp_path)) as err:
        DistributedCheckpointer(tmp_path).load(_training_state(0))
    assert "-000001" not in str(err.value)


def test_loading_state_the_checkpoint_lacks_is_an_error(tmp_path: Path) -> None:
    model_only = {"model": _training_state(0)["model"]}
    DistributedCheckpointer(tmp_path).save(model_only, 0)
    with pytest.raises(CheckpointLoadError, match=r"no \['optimizer'"):
        DistributedCheckpointer(tmp_path).load(_training_state(1))


_SAVER = textwrap.dedent(
    """
    import sys, torch
    from torch import nn
    from mm_checkpoint import DistributedCheckpointer
    torch.set_num_threads(1)
    model = nn.ParameterList([nn.Parameter(torch.full((1024, 1024), 1.0)) for _ in range(48)])
    ckpt = DistributedCheckpointer(sys.argv[1])
    ckpt.save({"model": model}, 1)
    print("saved 1", flush=True)
    with torch.no_grad():
        for p in model:
            p.fill_(2.0)
    while True:
        ckpt.save({"model": model}, 2)
    """
)


@pytest.mark.slow
def test_save_killed_mid_write_leaves_previous_checkpoint_loadable(tmp_path: Path) -> None:
    script = tmp_path / "saver.py"
    script.write_text(_SAVER)
    root = tmp_path / "ckpt"
    with subprocess.Popen(
        [sys.executable, str(script), str(root)], stdout=subprocess.PIPE, text=True
    ) as proc:
        try:
            assert proc.stdout.readline().strip() == "saved 1"
            partial = root / "iter_0000002.partial"
            deadline = time.monotonic() + 60
            while not any(f.suffix == ".distcp" and f.stat().st_size > 0 for f in _files(partial)):
                assert time.monotonic() < deadline, "the save of iteration 2 never started"
                time.sleep(0.001)
            os.kill(proc.pid, signal.SIGKILL)  # mid-write: data file exists, .metadata not yet
        finally:
            proc.kill()  # leaving the block closes its stdout and waits for it
    assert not (root / "iter_0000002").exists()
    assert (root / TRACKER_FILENAME).read_text().strip() == "1"
    model = nn.ParameterList([nn.Parameter(torch.zeros(1024, 1024)) for _ in range(48)])
    assert DistributedCheckpointer(root).load({"model": model}) == 1
    assert all(bool((p == 1.0).all()) for p in model)
    DistributedCheckpointer(root).save(
        {"model": model}, 2
    )  # the leftover partial dir does not block a new save
    assert latest_iteration(root) == 2


def _files(path: Path) -> list[Path]:
    try:
        return list(path.iterdir())
    except FileNotFoundError:
        return []


class _Position:
    """A per-rank entry that merges the states of a run saved at another data-parallel size."""

    def __init__(self) -> None:
        self.state = {"consumed": 0}
        self.merged: tuple | None = None

    def state_dict(self) -> dict:
        return dict(self.state)

    def load_state_dict(self, state: dict) -> None:
        self.state = dict(state)

    def load_rank_states(self, states: list, *, dp_rank: int, dp_size: int) -> None:
        self.merged = (states, dp_rank, dp_size)


def test_at_another_data_parallel_size_every_saved_rank_state_goes_to_load_rank_states(
    tmp_path: Path,
) -> None:
    position = _Position()
    position.state = {"consumed": 12}
    DistributedCheckpointer(tmp_path).save({"model": _training_state(0)["model"], "data": position}, 3)

    grown = _Position()
    DistributedCheckpointer(tmp_path, dp_rank=3, dp_size=4).load(
        {"model": _training_state(1)["model"], "data": grown}
    )
    assert grown.merged == ([{"consumed": 12}], 3, 4) and grown.state == {"consumed": 0}


class _Optional(_Position):
    optional_rank_state = True


def test_an_entry_no_saved_rank_holds_is_an_error_unless_it_is_optional(tmp_path: Path) -> None:
    DistributedCheckpointer(tmp_path).save({"model": _training_state(0)["model"], "data": _Position()}, 3)
    later = _Optional()
    later.state = {"consumed": 5}
    DistributedCheckpointer(tmp_path).load(
        {"model": _training_state(1)["model"], "data": _Position(), "new": later}
    )
    assert later.state == {"consumed": 5}  # left as it was
    with pytest.raises(CheckpointLoadError, match=r"holds no 'new' entry"):
        DistributedCheckpointer(tmp_path).load(
            {"model": _training_state(1)["model"], "data": _Position(), "new": _Position()}
        )


def test_an_entry_that_cannot_merge_rank_states_is_refused_at_another_data_parallel_size(
    tmp_path: Path,
) -> None:
    DistributedCheckpointer(tmp_path).save({"model": _training_state(0)["model"], "rng": RNGState()}, 3)
    with pytest.raises(
        CheckpointLoadError, match=r"'rng' was saved per data-parallel rank at dp size 1.*dp size 2"
    ):
        DistributedCheckpointer(tmp_path, dp_rank=0, dp_size=2).load(
            {"model": _training_state(1)["model"], "rng": RNGState()}
        )


def test_a_missing_rank_state_file_is_an_error_naming_it(tmp_path: Path) -> None:
    saved = _training_state(0)
    DistributedCheckpointer(tmp_path).save(saved, 3)
    rank_file = tmp_path / "iter_0000003" / "rank_state" / "dp_rank_00000.pt"
    rank_file.unlink()
    with pytest.raises(
        CheckpointLoadError, match=rf"lacks per-rank state \['{rank_file}'\].*\['dataloader'\]"
    ):
        DistributedCheckpointer(tmp_path).load(_training_state(1))


class _Payload:
    """Unpickling this runs ``exec``: what a crafted checkpoint file would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('ran')",))


def test_a_crafted_rank_state_pickle_runs_nothing_and_is_refused_naming_the_file(tmp_path: Path) -> None:
    DistributedCheckpointer(tmp_path).save(_training_state(0), 3)
    rank_file = tmp_path / "iter_0000003" / "rank_state" / "dp_rank_00000.pt"
    marker = tmp_path / "payload_ran"
    torch.save({"dp_rank": 0, "dp_size": 1, "state": {"dataloader": _Payload(marker)}}, rank_file)
    with pytest.raises(CheckpointLoadError, match=rf"{rank_file}: not loadable .*weights_only=True"):
        DistributedCheckpointer(tmp_path).load(_training_state(1))
    assert not marker.exists()


def test_per_rank_state_that_only_a_full_unpickler_could_load_is_refused_at_save(tmp_path: Path) -> None:
    state = {**_training_state(0), "dataloader": {"sampler": object()}}
    with pytest.raises(
        TypeError, match=r"entry 'dataloader'\['sampler'\] is a object: per-rank state holds only"
    ):
        DistributedCheckpointer(tmp_path).save(state, 3)


def test_rng_state_round_trips_through_a_weights_only_load(tmp_path: Path) -> None:
    import random

    import numpy as np

    DistributedCheckpointer(tmp_path).save({"model": _training_state(0)["model"], "rng": RNGState()}, 1)
    expected = (random.random(), float(np.random.rand()), torch.rand(2))
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    DistributedCheckpointer(tmp_path).load({"model": _training_state(1)["model"], "rng": RNGState()})
    got = (random.random(), float(np.random.rand()), torch.rand(2))
    assert got[:2] == expected[:2] and torch.equal(got[2], expected[2])
