"""The trainer's planned-vs-measured line: a background ``mm-train plan`` of the run, compared once it
is back (accelerator runs; exercised here on CPU by starting the check for the ``cpu`` device)."""

import logging
import os
import time
from pathlib import Path

from mm_config import load_config
from mm_trainer.loop.plan_check import PlanCheck

PLUGIN_DIR = Path(__file__).parent / "plugins"


def test_no_check_starts_on_a_cpu_run(toy_yaml):
    config = load_config(str(toy_yaml("run")), world_size=1, check_paths=False)
    assert PlanCheck.start(config, rank=0, world_size=1, device_type="cpu") is None


def test_the_plan_comes_back_and_is_logged_beside_the_measured_peak(toy_yaml, monkeypatch, caplog):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(PLUGIN_DIR), os.environ.get("PYTHONPATH", "")]))
    config = load_config(str(toy_yaml("run")), world_size=1, check_paths=False)
    check = PlanCheck(config, world_size=1, ranks_per_node=1, device="cpu", niceness=0)
    assert (
        check.after_step(1, measured_bytes=2**30) == {}
    )  # the plan is not back yet (it imports torch): nothing
    deadline = time.monotonic() + 120
    while check.process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    with caplog.at_level(logging.WARNING, logger="mm_trainer"):
        record = check.after_step(2, measured_bytes=2**30)
    assert record["planned_peak_memory_bytes"] > 0
    assert (
        "step 2: peak memory of rank 0 1.00 GiB measured" in caplog.text
        and "planned (mm-train plan" in caplog.text
    )
    assert check.after_step(3, measured_bytes=2**30) == {}  # once
    check.close()
