"""A stop signal on one rank stops every rank after the same step: the step's one all-reduce carries it.

World size 2 in two layouts: both ranks in one data-parallel group (cp_size 1), and two
context-parallel ranks of one data-parallel rank (cp_size 2), whose data-parallel groups are
disjoint, so an all-reduce over the data-parallel group alone would never tell rank 0.
"""

from __future__ import annotations

import os
import signal
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from mm_trainer import TrainEngine
from torch import nn

pytestmark = pytest.mark.slow


class ScaledLoss(nn.Module):
    """loss = w * scale, w starting at 1: each rank can give its own loss."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(()))
        self.scale = scale

    def forward(self, x: torch.Tensor) -> SimpleNamespace:
        return SimpleNamespace(loss=self.w * self.scale * x.mean())


class Batches:
    """Ones; on its ``call``-th batch, sends ``signum`` to this process (when ``signum`` is set)."""

    def __init__(self, signum: int | None = None, call: int = 0) -> None:
        self.signum, self.call, self.calls = signum, call, 0

    def next_batch(self) -> dict:
        self.calls += 1
        if self.signum is not None and self.calls == self.call:
            os.kill(os.getpid(), self.signum)
        return {"x": torch.ones(2, 4)}


def _engine(rank: int, world: int, cp_size: int, batches: Batches, saved: list[int]) -> TrainEngine:
    # ParallelState's layout: CP innermost, so a data-parallel group is the ranks of one CP rank
    groups = [dist.new_group(list(range(cp, world, cp_size))) for cp in range(cp_size)]
    model = ScaledLoss(scale=rank + 1.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    return TrainEngine(
        model=model, optimizer=optimizer, lr_scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0),
        batches=batches, device=torch.device("cpu"), dp_group=groups[rank % cp_size],
        cp_rank=rank % cp_size, cp_size=cp_size, save_fn=saved.append,
        training=SimpleNamespace(
            gradient_accumulation_steps=1, clip_grad=0.0, train_iters=10, log_interval=1, save_interval=100,
            nonfinite=SimpleNamespace(action="skip", max_consecutive=3), seed=0, log_sample_ids=False,
        ),
    )  # fmt: skip


def _stop_on_rank_1(rank: int, world: int, cp_size: int, signum: int) -> tuple[int, list[int]]:
    saved: list[int] = []
    batches = Batches(signum, call=3) if rank == 1 else Batches()
    last = _engine(rank, world, cp_size, batches, saved).train()
    return last, saved


def _first_step_losses(rank: int, world: int) -> list[float]:
    return [_engine(rank, world, cp_size, Batches(), []).train_step(1).loss for cp_size in (1, 2)]


@pytest.mark.parametrize(
    ("cp_size", "signum"),
    [(1, signal.SIGTERM), (2, signal.SIGINT)],
    ids=["SIGTERM, one data-parallel group", "SIGINT, context-parallel ranks of one data-parallel rank"],
)
def test_a_stop_signal_on_rank_1_stops_both_ranks_after_the_same_step_and_saves_it(
    distributed, cp_size, signum
):
    assert distributed(_stop_on_rank_1, 2, cp_size, signum) == [(3, [3]), (3, [3])]


def test_the_step_loss_is_still_averaged_over_the_data_parallel_group_only(distributed):
    # rank r's loss is r + 1: [cp_size 1: one group of both ranks, cp_size 2: each rank its own group]
    assert distributed(_first_step_losses, 2) == [[1.5, 1.0], [1.5, 2.0]]
