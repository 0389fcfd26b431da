"""The multi-process fixture itself: real gloo groups, results and failures come back."""

import pytest
import torch
import torch.distributed as dist


def test_all_reduce_over_two_real_gloo_ranks(distributed):
    def body(rank, world_size):
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t)
        return t.item()

    assert distributed(body, 2) == [3.0, 3.0]


def test_a_failing_rank_fails_the_test(distributed):
    def body(rank, world_size):
        if rank == 1:
            raise ValueError("boom on rank 1")
        return rank

    with pytest.raises(AssertionError, match="boom on rank 1"):
        distributed(body, 2, timeout=60)
