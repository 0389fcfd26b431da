"""A 2-layer toy transformer trained with context parallelism matches one process.

The model has a parameter before the sequence split (the token embedding) and after the gather
(the head), so the test pins the gradient convention: with ``grad_mode="adjoint"`` averaging the
gradients over the CP ranks (what FSDP does) is exact for every parameter. Attention is causal,
so each token must sit at its global position: a sequence split in one layout while the ring
attention is told another gives other losses.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from mm_parallel import attention, gather_sequence, ring_attention, split_sequence, ulysses_attention
from torch import nn

DIM, HEADS, SEQ, BATCH, STEPS, LR = 16, 4, 12, 2, 3, 0.2


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.GELU(), nn.Linear(2 * DIM, DIM))

    def forward(self, x: torch.Tensor, attn: Callable[..., torch.Tensor]) -> torch.Tensor:
        # x: batch, local_seq, dim
        q, k, v = (t.unflatten(-1, (HEADS, DIM // HEADS)) for t in self.qkv(self.norm1(x)).chunk(3, dim=-1))
        x = x + self.proj(attn(q, k, v).flatten(2))
        return x + self.mlp(self.norm2(x))


class Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed, self.head = nn.Linear(4, DIM), nn.Linear(DIM, 4)
        self.blocks = nn.ModuleList(Block() for _ in range(2))

    def forward(
        self, x: torch.Tensor, attn: Callable[..., torch.Tensor], group: dist.ProcessGroup | None, layout: str
    ) -> torch.Tensor:
        h = split_sequence(
            self.embed(x), 1, group, layout
        )  # 1. embed the full sequence, keep this rank's share
        for block in self.blocks:
            h = block(h, attn)
        return gather_sequence(self.head(h), 1, group, layout)  # 2. full prediction on every rank


def _train(
    attn: Callable[..., torch.Tensor], group: dist.ProcessGroup | None, layout: str = "contiguous"
) -> tuple[list[float], dict]:
    torch.manual_seed(0)
    model = Toy()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    gen = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(STEPS):
        x, target = torch.randn(BATCH, SEQ, 4, generator=gen), torch.randn(BATCH, SEQ, 4, generator=gen)
        loss = F.mse_loss(model(x, attn, group, layout), target)
        loss.backward()
        if group is not None:  # average over the CP ranks, as FSDP's reduce-scatter does
            for p in model.parameters():
                dist.all_reduce(p.grad, group=group)
                p.grad /= dist.get_world_size(group)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, {k: v.tolist() for k, v in model.state_dict().items()}  # plain lists cross processes


def _ring(layout: str, group: dist.ProcessGroup) -> Callable[..., torch.Tensor]:
    return partial(ring_attention, group=group, causal=True, layout=layout)


def _cp_worker(rank: int, world: int) -> dict[str, tuple[list[float], dict]]:
    group = dist.group.WORLD
    return {
        "ulysses": _train(partial(ulysses_attention, group=group, causal=True), group),
        "ring_zigzag": _train(_ring("zigzag", group), group, "zigzag"),
        "ring_contiguous": _train(_ring("contiguous", group), group, "contiguous"),
    }


_RUNS: dict = {}


@pytest.fixture
def runs(distributed) -> dict:  # noqa: ANN001
    """One single-process run and one 2-process launch training every CP kind (cached)."""
    if not _RUNS:
        _RUNS.update(single=_train(partial(attention, causal=True), None), cp=distributed(_cp_worker, 2))
    return _RUNS


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["ulysses", "ring_zigzag", "ring_contiguous"])
def test_three_steps_with_cp2_match_one_process_in_loss_and_params(runs, kind: str) -> None:  # noqa: ANN001
    single_losses, single_params = runs["single"]
    for rank_result in runs["cp"]:
        losses, params = rank_result[kind]
        torch.testing.assert_close(losses, single_losses, rtol=1e-5, atol=0)
        for name, value in single_params.items():
            torch.testing.assert_close(
                torch.tensor(params[name]), torch.tensor(value), rtol=1e-5, atol=1e-6, msg=name
            )
    assert single_losses[-1] < single_losses[0]  # it actually trained
