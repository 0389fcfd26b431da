"""ParallelState: size arithmetic, ranks and meshes (real gloo groups for the mesh tests)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from mm_parallel import ParallelState


def test_dp_shard_auto_fills_the_world() -> None:
    state = ParallelState(world_size=16, dp_replicate=2, ulysses=2, ring=2, device_type="cpu")
    assert (state.dp_shard, state.dp_size, state.cp_size, state.dp_shard_cp_size) == (2, 4, 4, 8)
    assert state.hsdp_enabled and state.cp_enabled and state.ulysses_enabled and state.ring_enabled


def test_ulysses_times_ring_not_dividing_world_spells_out_the_arithmetic() -> None:
    with pytest.raises(ValueError, match=r"ulysses \(3\) x ring \(2\) = 6 does not divide world size 8"):
        ParallelState(world_size=8, ulysses=3, ring=2, device_type="cpu")


def test_explicit_sizes_must_multiply_to_world() -> None:
    with pytest.raises(
        ValueError,
        match=r"dp_replicate \(1\) x dp_shard \(2\) x ulysses \(2\) x ring \(1\) = 4 != world size 8",
    ):
        ParallelState(world_size=8, dp_shard=2, ulysses=2, device_type="cpu")
    with pytest.raises(
        ValueError, match=r"dp_replicate \(3\) x ulysses \(1\) x ring \(1\) = 3 does not divide world size 8"
    ):
        ParallelState(world_size=8, dp_replicate=3, device_type="cpu")
    with pytest.raises(ValueError, match="ring must be a positive integer"):
        ParallelState(world_size=8, ring=0, device_type="cpu")


def test_without_process_group_ranks_are_zero_and_meshes_explain_what_to_do() -> None:
    assert not dist.is_initialized()
    state = ParallelState(world_size=4, ulysses=2, device_type="cpu")
    assert (state.dp_rank, state.cp_rank) == (0, 0)
    with pytest.raises(RuntimeError, match="init_distributed"):
        _ = state.fsdp_mesh


def _describe(state: ParallelState) -> dict:
    ranks = dist.get_process_group_ranks
    return {
        "dp": (state.dp_rank, state.dp_size),
        "cp": (state.cp_rank, state.cp_size),
        "ulysses": ranks(state.ulysses_group),
        "ring": ranks(state.ring_group),
        "cp_group": ranks(state.cp_group),
        "fsdp": (tuple(state.fsdp_mesh.shape), state.fsdp_mesh.mesh_dim_names),
    }


@pytest.mark.slow
def test_meshes_and_groups_at_world_4(distributed) -> None:
    def run(rank: int, world: int) -> dict:
        usp = ParallelState(ulysses=2, ring=2)
        ulysses_dp = ParallelState(ulysses=2)
        hsdp = ParallelState(dp_replicate=2)
        sub2, sub4 = hsdp.sub_mesh(2), hsdp.sub_mesh(4)
        bounded = ParallelState(ulysses=2, timeout_s=7)
        meshes = (
            bounded.world_mesh,
            bounded.dp_mesh,
            bounded.cp_mesh,
            bounded.fsdp_mesh,
            bounded.sub_mesh(1),
        )
        groups = [group for mesh in meshes for group in mesh.get_all_groups()]
        return {
            "timeouts": {g._get_backend(torch.device("cpu")).options._timeout for g in groups},
            "usp": _describe(usp),
            "ulysses_dp": _describe(ulysses_dp),
            "hsdp": _describe(hsdp),
            "hsdp_shard_group": dist.get_process_group_ranks(hsdp.fsdp_mesh.get_group("dp_shard_cp")),
            "sub2": (tuple(sub2.shape), dist.get_process_group_ranks(sub2.get_group("sub_shard"))),
            "sub4": tuple(sub4.shape),
        }

    out = distributed(run, 4)
    # timeout_s reaches every group of every mesh, not only the default group
    assert all(o["timeouts"] == {timedelta(seconds=7)} for o in out)
    # ulysses x ring = world: one CP group, ulysses innermost (neighbouring ranks)
    assert [o["usp"]["cp"] for o in out] == [(0, 4), (1, 4), (2, 4), (3, 4)]
    assert [o["usp"]["ulysses"] for o in out] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert [o["usp"]["ring"] for o in out] == [[0, 2], [1, 3], [0, 2], [1, 3]]
    assert all(o["usp"]["dp"] == (0, 1) for o in out)
    assert out[0]["usp"]["fsdp"] == ((4,), ("dp_shard_cp",))  # CP ranks also shard parameters
    # ulysses 2 at world 4: the two ranks of a CP group share a dp rank (read the same sample)
    assert [o["ulysses_dp"]["dp"] for o in out] == [(0, 2), (0, 2), (1, 2), (1, 2)]
    assert [o["ulysses_dp"]["cp_group"] for o in out] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    # HSDP: 2 replicas x 2 shards, shard groups are neighbouring ranks
    assert out[0]["hsdp"]["fsdp"] == ((2, 2), ("dp_replicate", "dp_shard_cp"))
    assert [o["hsdp_shard_group"] for o in out] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert [o["hsdp"]["dp"] for o in out] == [(0, 4), (1, 4), (2, 4), (3, 4)]
    assert out[2]["sub2"] == ((2, 2), [2, 3])
    assert out[0]["sub4"] == (4,)


def _all_reduce_with_a_stalled_peer(rank: int, world: int) -> float | None:
    state = ParallelState(world_size=world, timeout_s=2)
    if rank == 1:
        time.sleep(6)  # never joins the all-reduce below
        return None
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="Timed out waiting 2000ms"):
        dist.all_reduce(torch.ones(1), group=state.dp_group)
    return time.monotonic() - started


@pytest.mark.slow
def test_a_collective_the_other_rank_never_joins_fails_after_timeout_s(distributed) -> None:
    waited, _ = distributed(_all_reduce_with_a_stalled_peer, 2)
    assert 1.5 < waited < 5  # not the backend's 30 minutes
