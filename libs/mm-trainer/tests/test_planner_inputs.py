"""``mm-train plan`` and ``--dry-run`` refuse absurd inputs at once, before any plugin import, config read or
trace: a world size past what the planner traces, device memory and margins out of range, an unknown
device, each with one line naming the option and the range, exit 2, in well under a second (the config
path does not even exist: nothing reads it)."""

from __future__ import annotations

import time

import pytest
from mm_trainer.cli import main
from mm_trainer.planner.inputs import MAX_TRACED_WORLD_SIZE

NOWHERE = "/nonexistent/run.yaml"


def _refused(capsys, argv: list[str]) -> str:
    started = time.perf_counter()
    code = main(argv)
    elapsed = time.perf_counter() - started
    err = capsys.readouterr().err
    assert code == 2, err
    assert elapsed < 1.0, f"refused after {elapsed:.2f} s"
    assert "Traceback" not in err and NOWHERE not in err, err  # the config was never read
    return err


def test_a_world_size_past_what_the_planner_traces_is_refused_at_once_naming_the_limit_and_why(capsys):
    err = _refused(capsys, ["plan", "--config", NOWHERE, "--world-size", "100000000"])
    assert (
        f"--world-size 100000000 is beyond what the planner traces (at most {MAX_TRACED_WORLD_SIZE} ranks)"
        in err
    )
    assert "one piece per rank of its shard group" in err  # why: the trace grows with the world size


def test_the_largest_traced_world_size_is_not_refused_by_the_input_check(capsys):
    """The limit itself passes the input check: the missing config file is what stops this plan."""
    code = main(["plan", "--config", NOWHERE, "--world-size", str(MAX_TRACED_WORLD_SIZE)])
    assert code == 2 and NOWHERE in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--device-memory", "-5"], "--device-memory -5 GiB must be above the 1.5 GiB"),
        (["--device-memory", "1e12"], "at most 16384 GiB"),
        (["--margin", "1.5"], "--margin 1.5 must be in [0, 1)"),
        (["--margin", "-0.1"], "--margin -0.1 must be in [0, 1)"),
        (["--device", "h900"], "unknown device 'h900'; known: h200, h100"),
        (["--nnodes", "-2", "--nproc-per-node", "-4"], "--nnodes must be >= 1, got -2"),
        (["--nproc-per-node", "3"], "--nproc-per-node 3 must be a positive divisor of the world size 8"),
        (["--top", "0"], "--top must be >= 1"),
    ],
)
def test_plan_refuses_an_input_out_of_range_at_once_naming_the_option_and_the_range(capsys, args, message):
    world = [] if "--nnodes" in args else ["--world-size", "8"]
    err = _refused(capsys, ["plan", "--config", NOWHERE, *world, "--device", "h100", *args])
    assert message in err, err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--world-size", "100000000"], "is beyond what the planner traces"),
        (["--world-size", "8", "--device", "h900"], "unknown device 'h900'"),
        (["--nnodes", "0", "--nproc-per-node", "8"], "--nnodes must be >= 1, got 0"),
    ],
)
def test_a_dry_run_refuses_what_plan_refuses_before_reading_the_config(capsys, args, message):
    assert message in _refused(capsys, ["--config", NOWHERE, "--dry-run", *args])


def test_the_planner_api_refuses_a_world_it_cannot_trace_before_any_work():
    from mm_config import TrainConfig
    from mm_trainer.planner import PlanInputError, plan_device, search_layouts, trace_run

    device = plan_device("h100")
    with pytest.raises(PlanInputError, match="beyond what the planner traces"):
        trace_run(TrainConfig(), world_size=10**8, device=device)
    with pytest.raises(PlanInputError, match="beyond what the planner traces"):
        search_layouts(NOWHERE, [], world=10**8, ranks_per_node=8, device=device)
