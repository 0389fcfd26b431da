"""DistributedCheckpointer.save(background=True): staged at once, written by a thread, committed when
complete; retention (keep_last + keep_every)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from mm_checkpoint import CheckpointError, DistributedCheckpointer, latest_iteration
from mm_checkpoint.checkpointer import retained
from torch import nn


@pytest.fixture(autouse=True)
def _single_process_save_notice():
    # Without a process group DCP says it saves in one process, from the writer thread (outside the
    # checkpointer's own filter, which covers the caller's thread): expected here.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


class _Unpicklable:
    """Copied fine (staging), refused by pickle (the writer serializing it)."""

    def __deepcopy__(self, memo: dict) -> _Unpicklable:
        return _Unpicklable()

    def __reduce__(self):
        raise RuntimeError("this object cannot be written")


class _BadScheduler:
    """A scheduler whose state is copied fine but cannot be serialized: the write fails, not the staging."""

    def state_dict(self) -> dict:
        return {"bad": _Unpicklable()}


def _state() -> dict:
    torch.manual_seed(0)
    model = nn.Linear(64, 64)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 64)).sum().backward()
    optimizer.step()
    return {"model": model, "optimizer": optimizer}


def test_a_background_save_holds_the_state_of_its_call_and_commits_only_once_complete(tmp_path: Path) -> None:
    state = _state()
    ckpt = DistributedCheckpointer(tmp_path)
    ckpt.save(state, 1, background=True)
    assert latest_iteration(tmp_path) is None and ckpt.pending is not None  # not committed yet
    expected = state["model"].weight.detach().clone()
    with torch.no_grad():
        state["model"].weight.add_(1.0)  # training goes on: the staged copy is what gets written
    ckpt.finish_pending()
    assert latest_iteration(tmp_path) == 1 and not list(tmp_path.glob("*.partial"))
    loaded = nn.Linear(64, 64)
    DistributedCheckpointer(tmp_path).load({"model": loaded})
    torch.testing.assert_close(loaded.weight, expected, rtol=0, atol=0)
    weights = sum(t.numel() * 4 for t in state["model"].parameters())
    assert 3 * weights <= ckpt.staging_bytes <= 3 * weights + 16  # weights, 2 moments, 2 step counters


def test_a_failed_background_write_raises_at_the_next_check_and_leaves_the_previous_checkpoint(
    tmp_path: Path,
) -> None:
    state = _state()
    ckpt = DistributedCheckpointer(tmp_path)
    ckpt.save(state, 1)
    ckpt.save({**state, "lr_scheduler": _BadScheduler()}, 2, background=True)
    assert ckpt.pending is not None
    ckpt.pending.future.exception(timeout=60)  # the write ended (failed)
    with pytest.raises(
        CheckpointError, match=r"(?s)background save of iteration 2 .* failed: .*cannot be written"
    ):
        ckpt.check_pending()
    assert latest_iteration(tmp_path) == 1 and (tmp_path / "iter_0000001").is_dir()
    assert ckpt.pending is None  # reported once


def test_retention_keeps_the_newest_and_every_multiple() -> None:
    assert retained(range(1, 11), keep_last=2) == {9, 10}
    assert retained(range(1, 11), keep_last=2, keep_every=4) == {4, 8, 9, 10}
    assert retained([3, 6, 7], keep_last=None, keep_every=5) == {3, 6, 7}


def test_retention_deletes_only_after_the_new_checkpoint_and_only_up_to_it(tmp_path: Path) -> None:
    state = _state()
    first = DistributedCheckpointer(tmp_path, keep_last=1, keep_every=3)
    for it in (1, 2, 3, 4):
        first.save(state, it, background=True)
    first.finish_pending()
    assert sorted(p.name for p in tmp_path.glob("iter_*")) == ["iter_0000003", "iter_0000004"]
    resumed = DistributedCheckpointer(tmp_path, keep_last=1, keep_every=3)  # a resume: a new checkpointer
    resumed.save(state, 5)
    assert sorted(p.name for p in tmp_path.glob("iter_*")) == ["iter_0000003", "iter_0000005"]


@pytest.mark.slow
def test_a_two_rank_background_save_runs_on_its_own_group_and_loads_at_world_one(
    distributed, tmp_path: Path
) -> None:
    def body(rank: int, world: int) -> bool:
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard

        torch.manual_seed(0)
        model = fully_shard(nn.Linear(64, 64))
        state = {"model": model, "optimizer": torch.optim.AdamW(model.parameters())}
        with pytest.raises(ValueError, match="background_group"):
            DistributedCheckpointer(tmp_path).save(state, 1, background=True)
        ckpt = DistributedCheckpointer(tmp_path, background_group=dist.new_group(backend="gloo"))
        ckpt.save(state, 1, background=True)
        dist.all_reduce(torch.ones(1))  # the training's collectives go on while the write runs
        ckpt.finish_pending()  # rank 0 commits; the others only wait for their write
        return ckpt.pending is None

    assert distributed(body, 2) == [True, True]
    assert latest_iteration(tmp_path) == 1
    loaded = nn.Linear(64, 64)
    DistributedCheckpointer(tmp_path).load({"model": loaded})
    torch.manual_seed(0)
    torch.testing.assert_close(loaded.weight, nn.Linear(64, 64).weight, rtol=0, atol=0)
