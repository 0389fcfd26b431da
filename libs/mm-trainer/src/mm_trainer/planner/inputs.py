"""What ``mm-train plan`` (and ``--dry-run``'s estimate) accepts, checked before any plugin is imported,
any config read or anything traced: each refusal is one line naming the option, its value and the range
(the commands exit 2), in a fraction of a second.

- **World size** at most :data:`MAX_TRACED_WORLD_SIZE`. The planner traces rank 0 of the run in one
  process under a fake process group of the whole world: the group keeps a table of every rank, the
  layout's process groups list every rank, and FSDP2 cuts every parameter into one piece per rank of its
  shard group, so the trace's time and memory grow with the world size times the parameters (the toy
  model: 11 s at 16,384 ranks, 40 s at 65,536; a tiny Wan did not finish at 65,536 in 150 s, and
  100,000,000 ranks grew to 14 GB before printing a line).
- **Ranks per node** (``--nnodes`` / ``--nproc-per-node``) positive, dividing the world size.
- **Device memory** (``--device-memory``, GiB) above what the device loses before its first tensor
  (the table's ``reserved_gib``: with less, nothing can be allocated) and at most
  :data:`MAX_DEVICE_MEMORY_GIB` (no device or host holds more: a value past it is a unit mix-up).
- **Margin** (``--margin``): the fraction of usable memory kept free, in [0, 1).
- **Device**: a name of :data:`~mm_trainer.planner.device_specs.DEVICES` or ``cpu``.
"""

from __future__ import annotations

from mm_trainer.planner.device_specs import DeviceSpec, device_spec

MAX_TRACED_WORLD_SIZE = 16384
"""The largest world size the planner traces (module docstring: why)."""
MAX_DEVICE_MEMORY_GIB = 16384.0
"""The largest ``--device-memory`` accepted, GiB (16 TiB)."""


class PlanInputError(ValueError):
    """A planner input out of range (world size, ranks per node, device, its memory, the margin)."""


def check_world(world: int, ranks_per_node: int | None = None, *, what: str = "--world-size") -> None:
    """Refuse a world size the planner cannot trace, or ranks per node that do not fit it."""
    if world < 1:
        raise PlanInputError(f"{what} must be >= 1, got {world}")
    if world > MAX_TRACED_WORLD_SIZE:
        raise PlanInputError(
            f"{what} {world} is beyond what the planner traces (at most {MAX_TRACED_WORLD_SIZE} ranks): it runs "
            "rank 0 of the whole world in this process, where the fake process group and the layout's groups "
            "list every rank and FSDP2 cuts every parameter into one piece per rank of its shard group, so "
            "time and memory grow with the world size (65536 ranks take minutes even for a tiny model). Plan "
            f"at most {MAX_TRACED_WORLD_SIZE} ranks with the larger run's shard group "
            "(parallel.fully_shard_parallel_size): memory per rank depends on the shard group and the "
            "micro-batch, not on the number of replicas"
        )
    if ranks_per_node is not None and (ranks_per_node < 1 or world % ranks_per_node):
        raise PlanInputError(
            f"--nproc-per-node {ranks_per_node} must be a positive divisor of the world size {world}: every "
            "node runs the same number of ranks"
        )


def check_nodes(nnodes: int | None, nproc_per_node: int | None) -> None:
    """Refuse a node count or ranks per node below 1 (their product could still look valid)."""
    for option, value in (("--nnodes", nnodes), ("--nproc-per-node", nproc_per_node)):
        if value is not None and value < 1:
            raise PlanInputError(f"{option} must be >= 1, got {value}")


def plan_device(name: str, memory_gib: float | None = None, margin: float = 0.0) -> DeviceSpec:
    """The device a plan is for (:func:`~mm_trainer.planner.device_specs.device_spec`), refusing an
    unknown name, a memory the device could not allocate anything in or past any device's, and a
    margin outside [0, 1)."""
    spec = device_spec(name)  # an unknown name: ValueError naming the known ones
    if not 0.0 <= margin < 1.0:
        raise PlanInputError(
            f"--margin {margin:g} must be in [0, 1): the fraction of usable memory kept free (0.1 = 10%)"
        )
    if memory_gib is None:
        return spec
    if not spec.reserved_gib < memory_gib <= MAX_DEVICE_MEMORY_GIB:
        raise PlanInputError(
            f"--device-memory {memory_gib:g} GiB must be above the {spec.reserved_gib:g} GiB a process on "
            f"{spec.label} loses before its first tensor (its context and communicator buffers) and at most "
            f"{MAX_DEVICE_MEMORY_GIB:g} GiB (no device holds more: the value is in GiB)"
        )
    return device_spec(name, memory_gib)
