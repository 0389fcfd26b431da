"""Which ranks share a node, and which process groups of a ParallelState cross nodes.

A launcher places ranks on nodes in contiguous blocks: torchrun numbers the workers of the agent
with group rank ``g`` (one agent per node) from ``g * nproc_per_node`` to ``(g + 1) * nproc_per_node
- 1``, so with ``n`` ranks per node, rank ``r`` runs on node ``r // n``. ``ParallelState`` lays its
mesh out row-major with ``dp_replicate`` outermost and ``ulysses`` innermost, so a group of
consecutive mesh coordinates (a CP group, an FSDP shard group) is a block of consecutive ranks and
stays inside one node whenever its size divides the ranks per node. The replicate groups are
strided: they span nodes, and only they (and the data-parallel group, which carries no per-step
traffic of its own) need the inter-node network for every step.

:func:`mesh_rank_groups` computes the groups from the degrees alone (no process group), the same
arrangement ``init_device_mesh`` makes; :func:`node_crossings` and :func:`describe_node_layout`
say which of them cross nodes.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from mm_parallel.text_table import text_table

#: Mesh dims of ParallelState, outermost first (row-major: ``ulysses`` holds neighbouring ranks).
MESH_DIMS = ("dp_replicate", "dp_shard", "ring", "ulysses")

#: Process groups by name, each the mesh dims it spans (order as in the mesh).
GROUP_DIMS: dict[str, tuple[str, ...]] = {
    "ulysses": ("ulysses",),
    "ring": ("ring",),
    "cp": ("ring", "ulysses"),
    "shard": ("dp_shard", "ring", "ulysses"),
    "replicate": ("dp_replicate",),
    "dp": ("dp_replicate", "dp_shard"),
}

#: What each group carries, for the printed layout.
GROUP_ROLES = {
    "ulysses": "Ulysses all-to-all, every attention layer",
    "ring": "ring KV passes, every attention layer",
    "cp": "context-parallel group (ulysses x ring)",
    "shard": "FSDP all-gather / reduce-scatter, every unit",
    "replicate": "HSDP gradient all-reduce, once a step",
    "dp": "data-parallel group (sampler, loss average)",
}


@dataclass(frozen=True)
class NodeLayout:
    """``world_size`` ranks on nodes of ``ranks_per_node`` consecutive ranks each."""

    world_size: int
    ranks_per_node: int

    def __post_init__(self) -> None:
        if self.world_size < 1 or self.ranks_per_node < 1:
            raise ValueError(
                f"world size and ranks per node must be positive, got {self.world_size} and {self.ranks_per_node}"
            )
        if self.world_size % self.ranks_per_node:
            raise ValueError(
                f"{self.ranks_per_node} ranks per node do not divide the world size {self.world_size}: "
                "every node must run the same number of ranks (torchrun --nproc-per-node)"
            )

    @property
    def num_nodes(self) -> int:
        return self.world_size // self.ranks_per_node

    def node_of(self, rank: int) -> int:
        """The node that runs ``rank``."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside the world of {self.world_size}")
        return rank // self.ranks_per_node

    def nodes_of(self, ranks: Sequence[int]) -> list[int]:
        """The distinct nodes that run ``ranks``, ascending."""
        return sorted({self.node_of(r) for r in ranks})

    @classmethod
    def from_env(cls, world_size: int | None = None) -> NodeLayout:
        """The layout of this job from the launcher's environment.

        ``LOCAL_WORLD_SIZE`` (torchrun: ``--nproc-per-node``) gives the ranks per node; without it
        every rank is taken to run on one node. Where torchrun also set ``GROUP_RANK`` (this
        node's index), this rank's node by the arithmetic above must match it, or the error says
        that the nodes run different numbers of ranks.
        """
        world = world_size if world_size is not None else int(os.environ.get("WORLD_SIZE", "1"))
        local = os.environ.get("LOCAL_WORLD_SIZE")
        layout = cls(world, int(local) if local else world)
        rank, group_rank = os.environ.get("RANK"), os.environ.get("GROUP_RANK")
        if rank is not None and group_rank is not None and layout.node_of(int(rank)) != int(group_rank):
            raise ValueError(
                f"rank {rank} runs on node {group_rank} (GROUP_RANK) but {layout.ranks_per_node} ranks per node "
                f"(LOCAL_WORLD_SIZE) place it on node {layout.node_of(int(rank))}: start every node with the "
                "same --nproc-per-node"
            )
        return layout


def mesh_rank_groups(dp_replicate: int, dp_shard: int, ring: int, ulysses: int) -> dict[str, list[list[int]]]:
    """The ranks of every group of each kind in :data:`GROUP_DIMS`, for a ParallelState of these degrees.

    Ranks fill the mesh ``(dp_replicate, dp_shard, ring, ulysses)`` row-major, as ``init_device_mesh``
    does; a group holds the ranks that differ only in its dims.
    """
    shape = (dp_replicate, dp_shard, ring, ulysses)
    grid = torch.arange(math.prod(shape)).reshape(shape)
    groups = {}
    for name, dims in GROUP_DIMS.items():
        inside = [MESH_DIMS.index(d) for d in dims]
        outside = [i for i in range(len(MESH_DIMS)) if i not in inside]
        size = math.prod(shape[i] for i in inside)
        groups[name] = grid.permute(*outside, *inside).reshape(-1, size).tolist()
    return groups


def node_crossings(groups: Mapping[str, list[list[int]]], layout: NodeLayout) -> dict[str, int]:
    """For each kind of group, the most nodes one of its groups spans (1: every group inside a node)."""
    return {name: max(len(layout.nodes_of(g)) for g in members) for name, members in groups.items()}


def sub_plan_rank_groups(world_size: int, shard_size: int) -> dict[str, list[list[int]]]:
    """The shard and replicate groups of ``ParallelState.sub_mesh(shard_size)``: shard groups are blocks
    of ``shard_size`` consecutive ranks, replicas the ranks ``shard_size`` apart."""
    if shard_size < 1 or world_size % shard_size:
        raise ValueError(f"sub-plan shard_size {shard_size} does not divide world size {world_size}")
    grid = torch.arange(world_size).reshape(world_size // shard_size, shard_size)
    return {"shard": grid.tolist(), "replicate": grid.T.tolist()}


def describe_node_layout(
    groups: Mapping[str, list[list[int]]], layout: NodeLayout, roles: Mapping[str, str] = GROUP_ROLES
) -> str:
    """A text table: for each kind of group with more than one rank, its size, how many there are,
    how many nodes one spans, and what it carries (``roles``, by group name)."""
    spans = node_crossings(groups, layout)
    header = ("group", "ranks", "groups", "nodes", "traffic")
    rows = []
    for name, members in groups.items():
        if len(members[0]) == 1:
            continue
        where = "inside a node" if spans[name] == 1 else f"crosses nodes ({spans[name]})"
        rows.append((name, str(len(members[0])), str(len(members)), where, roles.get(name, "")))
    title = f"nodes: {layout.num_nodes} x {layout.ranks_per_node} ranks (world {layout.world_size})"
    if not rows:
        return f"{title}; no process group of more than one rank"
    return f"{title}\n{text_table(header, rows)}"
