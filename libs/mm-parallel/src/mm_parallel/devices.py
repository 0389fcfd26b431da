"""Accelerator detection and process-group initialization.

Three device families are supported: ``npu`` (Ascend, via ``torch_npu``, backend
``hccl``), ``cuda`` (backend ``nccl``) and ``cpu`` (backend ``gloo``, used by tests).
"""

from __future__ import annotations

import importlib.util
import os

import torch
import torch.distributed as dist

from mm_parallel.timeouts import as_timedelta

DEVICE_ENV_VAR = "MM_PARALLEL_DEVICE"
"""Environment variable that overrides device detection (``npu``, ``cuda`` or ``cpu``)."""

BACKENDS: dict[str, str] = {"npu": "hccl", "cuda": "nccl", "cpu": "gloo"}


def _npu_available() -> bool:
    if importlib.util.find_spec("torch_npu") is None:
        return False
    import torch_npu  # noqa: F401  (registers torch.npu)

    return bool(torch.npu.is_available())  # type: ignore[attr-defined]


def get_device_type(override: str | None = None) -> str:
    """Return ``"npu"``, ``"cuda"`` or ``"cpu"``.

    Priority: ``override`` argument, then the ``MM_PARALLEL_DEVICE`` environment
    variable, then detection (torch_npu importable with a device, then CUDA, else CPU).
    """
    choice = override or os.environ.get(DEVICE_ENV_VAR)
    if choice:
        if choice not in BACKENDS:
            raise ValueError(f"device type {choice!r} is not supported; expected one of {sorted(BACKENDS)}")
        return choice
    if _npu_available():
        return "npu"
    if torch.cuda.is_available():
        return "cuda"
    return "cpu"


def get_dist_backend(device_type: str) -> str:
    """Return the collective backend for a device type (``hccl``, ``nccl`` or ``gloo``)."""
    if device_type not in BACKENDS:
        raise ValueError(f"device type {device_type!r} is not supported; expected one of {sorted(BACKENDS)}")
    return BACKENDS[device_type]


def get_local_device(device_type: str | None = None) -> torch.device:
    """Return this process's device: ``<type>:<LOCAL_RANK>`` for accelerators, ``cpu`` otherwise."""
    device_type = get_device_type(device_type)
    if device_type == "cpu":
        return torch.device("cpu")
    return torch.device(device_type, int(os.environ.get("LOCAL_RANK", "0")))


def init_distributed(
    backend: str | None = None, device_type: str | None = None, timeout_s: float | None = None
) -> tuple[int, int]:
    """Initialize the default process group and return ``(rank, world_size)``.

    Under ``torchrun`` (``RANK`` and ``WORLD_SIZE`` set) the group is initialized from
    the environment. A plain single process (no ``torchrun``) gets a real 1-rank group
    backed by an in-memory store (no port is opened), so FSDP2 and DeviceMesh work the
    same way at world size 1. An already initialized group is reused. Accelerator
    processes also select their local device.

    ``timeout_s`` bounds the rendezvous and every collective of the default group (None: the
    backend's default); :class:`ParallelState` sets it on the groups it creates.
    """
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    device_type = get_device_type(device_type)
    backend = backend or get_dist_backend(device_type)
    if device_type != "cpu":
        getattr(torch, device_type).set_device(get_local_device(device_type))
    timeout = as_timedelta(timeout_s)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        dist.init_process_group(backend=backend, timeout=timeout)
    else:
        dist.init_process_group(
            backend=backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout
        )
    return dist.get_rank(), dist.get_world_size()
