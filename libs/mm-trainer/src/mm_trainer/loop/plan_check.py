"""Planned vs measured peak memory, logged at the first step a plan is ready (accelerator runs).

On an accelerator rank 0 starts ``mm-train plan`` for the run's own resolved config, world size and
device type in the background when the trainer starts (a separate process: the plan's fake process
group cannot share this one; ``nice`` 19, so it yields to the data loaders), and after each step
until the plan is back asks whether it is: then it logs the planned peak per rank beside this rank's
measured one (``max_memory_allocated``) once, and adds ``planned_peak_memory_bytes`` to that step's
metrics record. CPU runs start nothing (their measured peak is the process RSS, which a plan of
tensor memory does not predict), and neither does a device the planner's table does not know, nor a world
larger than the planner traces (``mm_trainer.planner.inputs``).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from mm_config import TrainConfig, dump_config

from mm_trainer.planner.device_specs import DEVICES, DeviceSpec
from mm_trainer.planner.inputs import MAX_TRACED_WORLD_SIZE

logger = logging.getLogger("mm_trainer")
GIB = 2**30


def accelerator_spec(device_type: str) -> DeviceSpec | None:
    """The planner's table entry for this process's accelerator (None on CPU or an unknown device)."""
    name = ""
    if device_type == "cuda" and torch.cuda.is_available():
        name = torch.cuda.get_device_name()
    elif device_type == "npu" and hasattr(torch, "npu"):
        name = torch.npu.get_device_name()  # type: ignore[attr-defined]
    for spec in DEVICES.values():
        if spec.device_type == device_type and any(key.lower() in name.lower() for key in spec.device_names):
            return spec
    return None


class PlanCheck:
    """One background ``mm-train plan`` of this run and the step-1 comparison (module docstring)."""

    def __init__(
        self, config: TrainConfig, *, world_size: int, ranks_per_node: int, device: str, niceness: int = 19
    ) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="mm_train_plan_"))
        config_path = self.folder / "config.yaml"
        dump_config(config, config_path)
        self.result = self.folder / "plan.json"
        command = [
            sys.executable, "-m", "mm_trainer", "plan", "--config", str(config_path), "--world-size", str(world_size),
            "--nproc-per-node", str(ranks_per_node), "--device", device, "--json", str(self.result),
        ]  # fmt: skip
        self.log = (self.folder / "plan.log").open("w")
        self.process = subprocess.Popen(
            command, stdout=self.log, stderr=subprocess.STDOUT, preexec_fn=lambda: os.nice(niceness)
        )
        self.done = False

    @classmethod
    def start(cls, config: TrainConfig, *, rank: int, world_size: int, device_type: str) -> PlanCheck | None:
        """The check of rank 0 on a known accelerator; None elsewhere."""
        spec = accelerator_spec(device_type)
        if rank != 0 or spec is None:
            return None
        if world_size > MAX_TRACED_WORLD_SIZE:
            logger.warning(
                "no planned peak: world size %d is beyond what mm-train plan traces (%d ranks; "
                "mm_trainer.planner.inputs says why)", world_size, MAX_TRACED_WORLD_SIZE,
            )  # fmt: skip
            return None
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        return cls(config, world_size=world_size, ranks_per_node=per_node, device=spec.name)

    def after_step(self, step: int, measured_bytes: int) -> dict[str, Any]:
        """Once the plan is back: log planned vs measured and return the metric to record."""
        if self.done or self.process.poll() is None:
            return {}
        self.done = True
        self.log.close()
        if self.process.returncode != 0 or not self.result.is_file():
            logger.warning(
                "step %d: no planned peak (mm-train plan failed: see %s)", step, self.folder / "plan.log"
            )
            return {}
        planned = int(json.loads(self.result.read_text())["peak_bytes"])
        off = measured_bytes / planned - 1 if planned else float("nan")
        logger.warning(
            "step %d: peak memory of rank 0 %.2f GiB measured (max_memory_allocated), %.2f GiB planned "
            "(mm-train plan, %+.1f%%)", step, measured_bytes / GIB, planned / GIB, 100 * off,
        )  # fmt: skip
        return {"planned_peak_memory_bytes": planned}

    def close(self) -> None:
        """Stop a plan still running (the run ended first)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        if not self.log.closed:
            self.log.close()
