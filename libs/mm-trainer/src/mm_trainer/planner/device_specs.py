"""The accelerators the planner and the MFU metric know: memory, peak FLOP/s, HBM and link bandwidth.

Figures are the vendors' dense (no sparsity) peaks per device, from their data sheets as collected
in Stas Bekman's ml-engineering accelerator tables (``compute/accelerator/README.md``; read
2026-12) and, for Ascend, Huawei's published figures as reported there and by cloud providers (the
910B ships in variants, 910B1-B4, that differ by about 10% in clocks: the table holds a mid
value). ``reserved_gib`` is what a process loses before its first tensor (CUDA / CANN context,
communicator buffers): an estimate, not a vendor figure. Links are per device and direction.
``mm-train plan --device-memory`` overrides the memory of any entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

HALF_PRECISION = ("torch.bfloat16", "torch.float16")
"""The dtypes whose matrix work runs at the tensor-core peak (named: this table imports no torch, so
that ``mm-train --help`` lists the devices without it)."""


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator type (per device, dense peaks)."""

    name: str
    """Key for ``--device`` (``h200``)."""
    label: str
    device_type: str
    """torch device type a run on it uses: ``cuda`` / ``npu`` / ``cpu``."""
    memory_gib: float
    """Total device memory as the driver reports it (``nvidia-smi`` / ``npu-smi`` total), GiB."""
    bf16_tflops: float
    """Dense bf16 / fp16 matrix peak, TFLOP/s."""
    fp32_tflops: float
    """fp32 peak without tensor-core shortcuts (torch's default for fp32 matmuls), TFLOP/s."""
    hbm_tbps: float
    """Memory bandwidth, TB/s."""
    intra_node_gbps: float
    """Device-to-device bandwidth inside a node (NVLink / HCCS), GB/s per direction."""
    inter_node_gbps: float
    """Network bandwidth per device between nodes, GB/s per direction."""
    host_gbps: float
    """Device <-> host bandwidth (PCIe), GB/s per direction: CPU offload traffic."""
    reserved_gib: float
    """Memory a process cannot use for tensors (context, communicator buffers): an estimate."""
    attention_kernel: str
    """The fused attention kernel a run picks there (an ``mm_parallel.attention_memory`` kernel)."""
    device_names: tuple[str, ...] = ()
    """Substrings of ``torch.cuda.get_device_name()`` / ``torch.npu.get_device_name()`` that identify it."""

    def peak_flops(self, dtype: Any) -> float:
        """Peak FLOP/s for matrix work in ``dtype`` (a ``torch.dtype``; half precision: the tensor-core peak)."""
        tflops = self.bf16_tflops if str(dtype) in HALF_PRECISION else self.fp32_tflops
        return tflops * 1e12

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * 2**30)


DEVICES: dict[str, DeviceSpec] = {
    spec.name: spec
    for spec in (
        DeviceSpec("h200", "NVIDIA H200 SXM (141 GB HBM3e)", "cuda", 140.4, 989.0, 67.0, 4.8,
                   450.0, 50.0, 64.0, 1.5, "flash", ("H200",)),
        DeviceSpec("h100", "NVIDIA H100 SXM (80 GB HBM3)", "cuda", 79.6, 989.0, 67.0, 3.35,
                   450.0, 50.0, 64.0, 1.5, "flash", ("H100",)),
        DeviceSpec("b200", "NVIDIA B200 SXM (180 GB HBM3e)", "cuda", 179.1, 2250.0, 75.0, 8.0,
                   900.0, 50.0, 64.0, 1.5, "flash", ("B200",)),
        DeviceSpec("a100", "NVIDIA A100 SXM (80 GB HBM2e)", "cuda", 80.0, 312.0, 19.5, 2.04,
                   300.0, 25.0, 32.0, 1.5, "flash", ("A100",)),
        DeviceSpec("910b", "Huawei Ascend 910B (64 GB HBM2e)", "npu", 64.0, 313.0, 78.0, 1.6,
                   196.0, 25.0, 32.0, 2.0, "npu", ("910B", "Ascend910B")),
        DeviceSpec("910c", "Huawei Ascend 910C (128 GB HBM)", "npu", 128.0, 780.0, 190.0, 3.2,
                   392.0, 50.0, 64.0, 2.0, "npu", ("910C", "Ascend910C")),
    )
}  # fmt: skip
"""``--device`` choices of ``mm-train plan``."""

DEFAULT_DEVICE = "h100"
DEFAULT_MARGIN = 0.10
"""The share of a device's memory a plan keeps free (``--margin``): what it calls fitting."""
"""The device of ``plan``'s and ``--dry-run``'s estimate unless ``--device`` names another."""

CPU_CHECK = DeviceSpec(
    "cpu", "this machine's CPU (planner checks against CPU runs)", "cpu", 0.0, 0.0, 0.0, 0.0,
    0.0, 0.0, 0.0, 0.0, "cpu_flash",
)  # fmt: skip
"""``--device cpu``: memory only (no time: no FLOP/s figures), the CPU kernels' memory models; what
``benchmarks/plan_accuracy.py`` compares real CPU runs with."""


def device_spec(name: str, memory_gib: float | None = None) -> DeviceSpec:
    """The table entry for ``name`` (``h200``, ..., or ``cpu``), with ``memory_gib`` replacing its memory."""
    key = name.lower()
    spec = CPU_CHECK if key == "cpu" else DEVICES.get(key)
    if spec is None:
        raise ValueError(f"unknown device {name!r}; known: {', '.join([*DEVICES, 'cpu'])}")
    if memory_gib is None:
        return spec
    return DeviceSpec(**{**spec.__dict__, "memory_gib": float(memory_gib)})


def peak_flops_by_device_name() -> dict[str, float]:
    """Dense bf16 peak FLOP/s keyed by device-name substring (the MFU metric's table)."""
    return {key: spec.bf16_tflops * 1e12 for spec in DEVICES.values() for key in spec.device_names}
