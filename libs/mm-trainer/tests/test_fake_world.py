"""The planner's fake world leaves the process as it found it."""

import torch
from mm_trainer.planner.fake_world import fake_world
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard


def _coordinate_of_a_sharded_sum(rank: int) -> tuple[int, ...] | None:
    """In a fake world of 2 where this process is ``rank``: the mesh coordinate of ``bias + 1``, a
    1-D tensor sharded as FSDP shards a bias."""
    with fake_world(2, rank=rank):
        mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("dp_shard_cp",))
        bias = DTensor.from_local(torch.zeros(32), mesh, [Shard(0)])
        return (bias + 1).device_mesh.get_coordinate()


def test_sharding_decisions_made_in_a_fake_world_do_not_outlive_it():
    # DTensor caches its sharding decisions by op schema, whose meshes compare by value, not by rank:
    # a decision made while planning (as rank 0) handed a later run's rank 1 the planner's mesh, so
    # its biases claimed rank 0's shard and its first checkpoint was refused ("invalid fill").
    assert _coordinate_of_a_sharded_sum(0) == (0,)
    assert _coordinate_of_a_sharded_sum(1) == (1,)
