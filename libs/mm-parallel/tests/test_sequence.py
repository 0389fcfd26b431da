"""split_sequence / gather_sequence: layouts, exact round trips, uneven lengths and gradients.

The distributed checks run in ONE 4-process launch: the world group (P=4) and two pair groups
(P=2) are exercised in the same worker, which returns a report per check.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from mm_parallel import gather_sequence, local_token_indices, padded_length, split_sequence

LAYOUTS = ("contiguous", "zigzag")
LENGTHS = (16, 13, 7)  # divisible by 2P for P in {2, 4}; uneven; shorter than 2P for P = 4


def _groups(rank: int) -> dict[int, dist.ProcessGroup]:
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    return {4: dist.new_group([0, 1, 2, 3]), 2: pairs[rank // 2]}


def _round_trip_worker(rank: int, world: int) -> dict[str, bool]:
    report = {}
    for size, group in _groups(rank).items():
        for layout in LAYOUTS:
            for length in LENGTHS:
                x = torch.randn(3, length, 5, generator=torch.Generator().manual_seed(length))
                for dim in (1, -2):
                    local = split_sequence(x, dim, group, layout, pad=True)
                    back = gather_sequence(local, dim, group, layout, seq_len=length)
                    report[f"P{size}-{layout}-L{length}-dim{dim}"] = torch.equal(back, x)
    return report


def _order_worker(rank: int, world: int) -> dict[str, list[int]]:
    x = torch.arange(8)
    pair = _groups(rank)[2]
    local = split_sequence(x, 0, pair, "zigzag")
    parts = [torch.empty_like(local) for _ in range(2)]
    dist.all_gather(parts, local, group=pair)
    naive = torch.cat(parts)  # a plain gather: rank 0's chunks, then rank 1's
    return {
        "zigzag4": split_sequence(x, 0, None if world == 1 else dist.group.WORLD, "zigzag").tolist(),
        "zigzag2": local.tolist(),
        "naive_chunk_order2": (naive[::2] // 2).tolist(),
        "gathered2": gather_sequence(local, 0, pair, "zigzag").tolist(),
    }


def _grad_worker(rank: int, world: int) -> dict[str, bool]:
    group = dist.group.WORLD
    report = {}
    for layout in LAYOUTS:
        # adjoint: per-rank gradients add up to the gradient of the sum of the ranks' losses
        x = torch.randn(2, 8, 3, generator=torch.Generator().manual_seed(0), requires_grad=True)
        w = torch.randn(2, 8, 3, generator=torch.Generator().manual_seed(10 + rank))
        (gather_sequence(split_sequence(x, 1, group, layout), 1, group, layout) * w).sum().backward()
        summed_grad, summed_w = x.grad.clone(), w.clone()
        dist.all_reduce(summed_grad)
        dist.all_reduce(summed_w)
        report[f"adjoint-{layout}"] = torch.allclose(summed_grad, summed_w, rtol=0, atol=1e-6)
        # replicated: the same loss on every rank gives every rank the full (unsummed) gradient
        x.grad = None
        same_w = torch.randn(2, 8, 3, generator=torch.Generator().manual_seed(99))
        local = split_sequence(x, 1, group, layout, grad_mode="replicated")
        (gather_sequence(local, 1, group, layout, grad_mode="replicated") * same_w).sum().backward()
        report[f"replicated-{layout}"] = torch.equal(x.grad, same_w)
    return report


@pytest.mark.slow
def test_split_then_gather_is_bit_exact_for_every_layout_and_uneven_lengths(distributed) -> None:  # noqa: ANN001
    reports = distributed(_round_trip_worker, 4)
    failed = sorted({key for r in reports for key, ok in r.items() if not ok})
    assert len(reports[0]) == 2 * len(LAYOUTS) * len(LENGTHS) * 2
    assert failed == []


@pytest.mark.slow
def test_zigzag_order_is_chunks_r_and_2p_minus_1_minus_r(distributed) -> None:  # noqa: ANN001
    reports = distributed(_order_worker, 4)
    assert [r["zigzag4"] for r in reports] == [[0, 7], [1, 6], [2, 5], [3, 4]]
    assert [r["zigzag2"] for r in reports[:2]] == [[0, 1, 6, 7], [2, 3, 4, 5]]
    # the bug the reference RFC fixed: a plain gather of zigzag shards scrambles chunk order to 0,3,1,2
    assert reports[0]["naive_chunk_order2"] == [0, 3, 1, 2]
    assert all(r["gathered2"] == list(range(8)) for r in reports)


@pytest.mark.slow
def test_split_and_gather_gradients_follow_their_grad_mode(distributed) -> None:  # noqa: ANN001
    reports = distributed(_grad_worker, 2)
    assert all(all(r.values()) for r in reports), reports


@pytest.mark.slow
def test_uneven_length_without_pad_raises_with_the_numbers(distributed) -> None:  # noqa: ANN001
    def worker(rank: int, world: int) -> str:
        with pytest.raises(ValueError) as err:
            split_sequence(torch.zeros(1, 13), 1, dist.group.WORLD, "zigzag")
        return str(err.value)

    message = distributed(worker, 2)[0]
    assert "length 13" in message and "divisible by 4" in message and "pad=True" in message


def test_padded_length_rounds_up_to_the_layout_multiple() -> None:
    assert padded_length(13, 2, "contiguous") == 14
    assert padded_length(13, 2, "zigzag") == 16
    assert padded_length(13, 1, "zigzag") == 13


def test_local_token_indices_follow_the_layout() -> None:
    assert local_token_indices(8, 1, 2, "zigzag").tolist() == [2, 3, 4, 5]
    assert local_token_indices(8, 1, 2, "contiguous").tolist() == [4, 5, 6, 7]


def test_group_none_is_identity() -> None:
    x = torch.randn(2, 5)
    assert split_sequence(x, 1, None, "zigzag") is x
    assert gather_sequence(x, 1, None, "zigzag", seq_len=3).shape == (2, 3)


def test_unknown_layout_is_rejected() -> None:
    with pytest.raises(ValueError, match="layout must be one of"):
        split_sequence(torch.zeros(2), 0, None, "striped")  # type: ignore[arg-type]
