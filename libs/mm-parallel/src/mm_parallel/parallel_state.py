"""ParallelState: the validated parallel topology and its DeviceMesh.

Mesh axes, outermost to innermost (ranks are laid out row-major, so the innermost
axis holds neighbouring ranks):

- ``dp_replicate``: HSDP replicas (gradients all-reduced across them);
- ``dp_shard``: data-parallel ranks that shard parameters;
- ``ring``: ring-attention ranks (KV passed around the ring);
- ``ulysses``: Ulysses ranks (all-to-all sequence <-> heads), innermost because its
  all-to-all is the most bandwidth hungry.

Flattened views: ``dp`` = (dp_replicate, dp_shard) is the data-parallel group (ranks
that read different samples; all ranks of one CP group read the same sample);
``cp`` = (ring, ulysses), so ``cp_rank = ring_rank * ulysses + ulysses_rank``;
``dp_shard_cp`` = (dp_shard, ring, ulysses) is the FSDP shard group (CP ranks also
shard parameters, as in torchtitan).
"""

from __future__ import annotations

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from mm_parallel.devices import get_device_type
from mm_parallel.node_layout import MESH_DIMS, mesh_rank_groups
from mm_parallel.timeouts import set_collective_timeout
from mm_parallel.ulysses import UlyssesOverlap


def _check_positive(name: str, value: int) -> None:
    if not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def resolve_sizes(world_size: int, dp_replicate: int, dp_shard: int, ulysses: int, ring: int) -> int:
    """Validate the degrees against ``world_size`` and return ``dp_shard`` (resolving -1 = auto)."""
    for name, value in (("world_size", world_size), ("dp_replicate", dp_replicate)):
        _check_positive(name, value)
    _check_positive("ulysses", ulysses)
    _check_positive("ring", ring)
    cp = ulysses * ring
    if world_size % cp:
        raise ValueError(
            f"ulysses ({ulysses}) x ring ({ring}) = {cp} does not divide world size {world_size}"
        )
    fixed = dp_replicate * cp
    if dp_shard in (-1, None):
        if world_size % fixed:
            raise ValueError(
                f"dp_replicate ({dp_replicate}) x ulysses ({ulysses}) x ring ({ring}) = {fixed} "
                f"does not divide world size {world_size}, so dp_shard cannot be derived"
            )
        return world_size // fixed
    _check_positive("dp_shard", dp_shard)
    if dp_replicate * dp_shard * cp != world_size:
        raise ValueError(
            f"dp_replicate ({dp_replicate}) x dp_shard ({dp_shard}) x ulysses ({ulysses}) x ring ({ring}) "
            f"= {dp_replicate * dp_shard * cp} != world size {world_size}"
        )
    return dp_shard


class ParallelState:
    """Parallel degrees, their DeviceMesh, and the groups derived from it.

    Sizes are validated at construction (no process group needed). The meshes are
    built at construction when a default process group exists (a collective call:
    every rank must construct its ParallelState at the same point); without one,
    mesh and group accessors raise.

    Args:
        world_size: total ranks; defaults to the process group's size (1 without one).
        dp_replicate: HSDP replica count (1 = plain FSDP).
        dp_shard: FSDP shard degree over data-parallel ranks; -1 derives it.
        ulysses: Ulysses context-parallel degree.
        ring: Ring-attention context-parallel degree.
        device_type: ``npu`` / ``cuda`` / ``cpu``; detected when omitted.
        timeout_s: seconds a collective on any of its groups may wait for the other ranks before
            it fails (the groups a mesh creates do not inherit the default group's timeout);
            None keeps the backend's default.
        ulysses_overlap: how the Ulysses all-to-alls overlap compute (:class:`mm_parallel.UlyssesOverlap`);
            the models' :class:`mm_parallel.SequenceParallelPlan` reads it. Default: the device's.
    """

    def __init__(
        self,
        world_size: int | None = None,
        dp_replicate: int = 1,
        dp_shard: int = -1,
        ulysses: int = 1,
        ring: int = 1,
        device_type: str | None = None,
        timeout_s: float | None = None,
        ulysses_overlap: UlyssesOverlap | None = None,
    ) -> None:
        if world_size is None:
            world_size = dist.get_world_size() if dist.is_initialized() else 1
        self.world_size = world_size
        self.dp_replicate = dp_replicate
        self.dp_shard = resolve_sizes(world_size, dp_replicate, dp_shard, ulysses, ring)
        self.ulysses = ulysses
        self.ring = ring
        self.device_type = get_device_type(device_type)
        self.timeout_s = timeout_s
        self.ulysses_overlap = UlyssesOverlap() if ulysses_overlap is None else ulysses_overlap
        self._meshes: dict[str, DeviceMesh] = {}
        self._sub_meshes: dict[int, DeviceMesh] = {}
        if dist.is_initialized():
            if dist.get_world_size() != world_size:
                raise ValueError(
                    f"ParallelState world_size {world_size} != process group size {dist.get_world_size()}"
                )
            self._build_meshes()

    def __repr__(self) -> str:
        return (
            f"ParallelState(world_size={self.world_size}, dp_replicate={self.dp_replicate}, "
            f"dp_shard={self.dp_shard}, ring={self.ring}, ulysses={self.ulysses})"
        )

    # ----- construction -------------------------------------------------------------------
    def _build_meshes(self) -> None:
        shape = (self.dp_replicate, self.dp_shard, self.ring, self.ulysses)
        world = init_device_mesh(self.device_type, shape, mesh_dim_names=MESH_DIMS)
        self._meshes["world"] = world
        self._meshes["dp"] = world["dp_replicate", "dp_shard"]._flatten("dp")
        self._meshes["cp"] = world["ring", "ulysses"]._flatten("cp")
        self._meshes["dp_shard_cp"] = world["dp_shard", "ring", "ulysses"]._flatten("dp_shard_cp")
        if self.dp_replicate > 1:
            # A fresh 2-D mesh over the same rank layout (slicing a flattened dim together
            # with a root dim is deprecated in recent torch).
            self._meshes["hsdp"] = DeviceMesh(
                self.device_type,
                world.mesh.reshape(self.dp_replicate, -1),
                mesh_dim_names=("dp_replicate", "dp_shard_cp"),
            )
        for mesh in self._meshes.values():
            self._bound(mesh)

    def _bound(self, mesh: DeviceMesh) -> None:
        if self.timeout_s is not None:
            set_collective_timeout(mesh.get_all_groups(), self.timeout_s)

    def _mesh(self, name: str) -> DeviceMesh:
        if name not in self._meshes:
            raise RuntimeError(
                f"ParallelState has no '{name}' mesh: no default process group existed when it was "
                "built; call mm_parallel.init_distributed() before constructing ParallelState"
            )
        return self._meshes[name]

    def _coordinate(self, dim: str) -> int:
        if not self._meshes:
            return 0
        return self._mesh("world").get_local_rank(dim)

    # ----- sizes --------------------------------------------------------------------------
    @property
    def cp_size(self) -> int:
        """Context-parallel degree (ulysses x ring)."""
        return self.ulysses * self.ring

    @property
    def dp_size(self) -> int:
        """Data-parallel degree: number of distinct samples per step slot (replicate x shard)."""
        return self.dp_replicate * self.dp_shard

    @property
    def dp_shard_cp_size(self) -> int:
        """Size of the FSDP shard group (dp_shard x cp)."""
        return self.dp_shard * self.cp_size

    @property
    def ulysses_size(self) -> int:
        return self.ulysses

    @property
    def ring_size(self) -> int:
        return self.ring

    # ----- ranks --------------------------------------------------------------------------
    @property
    def dp_rank(self) -> int:
        """Data-parallel rank (what a sampler shards by); equal across one CP group."""
        return self._coordinate("dp_replicate") * self.dp_shard + self._coordinate("dp_shard")

    @property
    def cp_rank(self) -> int:
        """Rank inside the CP group: ``ring_rank * ulysses + ulysses_rank``."""
        return self.ring_rank * self.ulysses + self.ulysses_rank

    @property
    def ulysses_rank(self) -> int:
        return self._coordinate("ulysses")

    @property
    def ring_rank(self) -> int:
        return self._coordinate("ring")

    # ----- enabled flags ------------------------------------------------------------------
    @property
    def dp_replicate_enabled(self) -> bool:
        return self.dp_replicate > 1

    @property
    def dp_shard_enabled(self) -> bool:
        return self.dp_shard > 1

    @property
    def ulysses_enabled(self) -> bool:
        return self.ulysses > 1

    @property
    def ring_enabled(self) -> bool:
        return self.ring > 1

    @property
    def cp_enabled(self) -> bool:
        return self.cp_size > 1

    @property
    def hsdp_enabled(self) -> bool:
        """True when parameters are replicated across ``dp_replicate`` groups (2-D FSDP mesh)."""
        return self.dp_replicate > 1

    @property
    def fsdp_enabled(self) -> bool:
        """True when parameters are sharded (the FSDP shard group has more than one rank)."""
        return self.dp_shard_cp_size > 1

    # ----- meshes and groups --------------------------------------------------------------
    def rank_groups(self) -> dict[str, list[list[int]]]:
        """The ranks of every ``ulysses`` / ``ring`` / ``cp`` / ``shard`` / ``replicate`` / ``dp`` group of
        this layout (:func:`mm_parallel.node_layout.mesh_rank_groups`); needs no process group."""
        return mesh_rank_groups(self.dp_replicate, self.dp_shard, self.ring, self.ulysses)

    @property
    def world_mesh(self) -> DeviceMesh:
        """4-D mesh with dims ``("dp_replicate", "dp_shard", "ring", "ulysses")``."""
        return self._mesh("world")

    @property
    def dp_mesh(self) -> DeviceMesh:
        """1-D flattened data-parallel mesh ``dp``."""
        return self._mesh("dp")

    @property
    def cp_mesh(self) -> DeviceMesh:
        """1-D flattened context-parallel mesh ``cp`` (ring outer, ulysses inner)."""
        return self._mesh("cp")

    @property
    def fsdp_mesh(self) -> DeviceMesh:
        """Mesh for ``fully_shard``: 1-D ``dp_shard_cp``, or 2-D (``dp_replicate``, ``dp_shard_cp``) for HSDP."""
        return self._mesh("hsdp") if self.hsdp_enabled else self._mesh("dp_shard_cp")

    @property
    def dp_group(self) -> dist.ProcessGroup:
        return self.dp_mesh.get_group()

    @property
    def cp_group(self) -> dist.ProcessGroup:
        return self.cp_mesh.get_group()

    @property
    def ulysses_group(self) -> dist.ProcessGroup:
        return self.world_mesh.get_group("ulysses")

    @property
    def ring_group(self) -> dist.ProcessGroup:
        return self.world_mesh.get_group("ring")

    def sub_mesh(self, shard_size: int) -> DeviceMesh:
        """Mesh for a sub-model sharded over ``shard_size`` ranks (a sub-plan).

        Returns the global FSDP mesh when ``shard_size`` equals its shard group size
        with no replication, a 1-D mesh over all ranks when ``shard_size`` is the world
        size, and otherwise a 2-D (``sub_replicate``, ``sub_shard``) mesh of shape
        ``(world / shard_size, shard_size)`` whose shard groups are contiguous ranks.
        With ``fully_shard`` the 2-D mesh is HSDP: all-gather and reduce-scatter stay in
        the shard group and gradients are all-reduced across replicas. Meshes are cached;
        a new one is a collective call (every rank must ask in the same order).
        """
        _check_positive("shard_size", shard_size)
        if self.world_size % shard_size:
            raise ValueError(f"sub-plan shard_size {shard_size} does not divide world size {self.world_size}")
        if shard_size == self.dp_shard_cp_size and not self.hsdp_enabled:
            return self.fsdp_mesh
        if shard_size not in self._sub_meshes:
            ranks = self.world_mesh.mesh.flatten()
            if shard_size == self.world_size:
                mesh = DeviceMesh(self.device_type, ranks, mesh_dim_names=("sub_shard",))
            else:
                mesh = DeviceMesh(
                    self.device_type,
                    ranks.reshape(self.world_size // shard_size, shard_size),
                    mesh_dim_names=("sub_replicate", "sub_shard"),
                )
            self._bound(mesh)
            self._sub_meshes[shard_size] = mesh
        return self._sub_meshes[shard_size]
