"""`broadcast_tensor_dict` over real gloo groups: every rank ends with the sender's dict."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from mm_parallel import broadcast_tensor_dict


def _payload() -> dict:
    gen = torch.Generator().manual_seed(3)
    return {
        "latents": torch.randn(2, 4, 3, 5, generator=gen),
        "mask": torch.tensor([[True, False], [False, True]]),
        "ids": torch.arange(6, dtype=torch.int64).view(2, 3),
        "half": torch.randn(3, generator=gen).to(torch.bfloat16),
        "grid": (3, 4, 5),
        "frame_rate": 24.0,
    }


def _broadcast_from_each_rank(rank: int, world_size: int) -> list[dict]:
    group = dist.new_group(list(range(world_size)))
    received = []
    for src in range(world_size):
        data = {**_payload(), "sender": src} if rank == src else None
        received.append(broadcast_tensor_dict(data, src=src, group=group, device="cpu"))
    return received


def test_every_rank_receives_the_senders_tensors_and_values_with_their_dtypes(distributed):
    expected = _payload()
    for per_rank in distributed(_broadcast_from_each_rank, 2):
        for src, got in enumerate(per_rank):
            assert got.keys() == {*expected, "sender"}
            assert got["sender"] == src and got["grid"] == (3, 4, 5) and got["frame_rate"] == 24.0
            for key in ("latents", "mask", "ids", "half"):
                assert got[key].dtype == expected[key].dtype, key
                assert torch.equal(got[key], expected[key]), key


def test_without_a_group_the_data_comes_back_unchanged():
    data = {"x": torch.ones(2)}
    assert broadcast_tensor_dict(data, src=0, group=None, device="cpu") is data


def _nested(rank: int, world_size: int) -> str:
    group = dist.new_group([0, 1])
    if rank == 0:
        with pytest.raises(TypeError, match="value 'pair' nests tensors in a tuple"):
            broadcast_tensor_dict({"pair": (torch.ones(1), torch.ones(1))}, src=0, group=group, device="cpu")
    # rank 1 sends nothing and would exit at once: a peer gone while the other still connects its new group
    # fails that rank's connectFullMesh (seen under load)
    dist.barrier(group)
    return "ok"


def test_tensors_nested_in_containers_are_refused_before_sending(distributed):
    assert distributed(_nested, 2) == ["ok", "ok"]
