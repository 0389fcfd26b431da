"""``tools.profile`` and ``tools.memory_profile`` with the device's own tool: a trace of the profiled steps'
ops, an allocator snapshot; the NPU path against a torch_npu stand-in bound to the real signatures
(``npu_profiler_api.py``)."""

from __future__ import annotations

import enum
import importlib.util
import json
import pickle
import sys
import types
from pathlib import Path

import pytest
import torch
from mm_trainer.tools.profiling import MemoryProfiler, StepProfiler
from torch import nn

ACTIVATION = (256, 4096)  # float32: a 4 MiB activation in every step


def _load_pins() -> types.ModuleType:
    """``npu_profiler_api.py`` beside this file (tests import with --import-mode=importlib: no sys.path)."""
    path = Path(__file__).with_name("npu_profiler_api.py")
    spec = importlib.util.spec_from_file_location("mm_trainer_npu_profiler_api", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PINS = _load_pins()


def train_steps(*profilers, steps: int = 4) -> None:
    """``steps`` optimizer steps of a small MLP, each inside ``record_function("train_step_<i>")``."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, ACTIVATION[1]), nn.ReLU(), nn.Linear(ACTIVATION[1], 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        for prof in profilers:
            prof.step_begin(step)
        with torch.profiler.record_function(f"train_step_{step}"):
            model(torch.randn(ACTIVATION[0], 64)).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        for prof in profilers:
            prof.step_end(step)


def event_names(trace: Path) -> set[str]:
    return {e.get("name") for e in json.loads(trace.read_text())["traceEvents"]}


def test_a_cpu_trace_holds_the_ops_of_the_profiled_steps_only(tmp_path):
    profiler = StepProfiler(enable=True, start_step=1, end_step=3, output_dir=str(tmp_path), rank=0)
    train_steps(profiler)
    names = event_names(tmp_path / "trace_rank0.json")
    assert {"train_step_1", "train_step_2"} <= names and not {"train_step_0", "train_step_3"} & names
    assert {
        "aten::addmm",
        "aten::mm",
        "aten::relu",
        "Optimizer.step#SGD.step",
    } <= names  # forward, backward, step


def test_a_cpu_memory_profile_writes_the_allocator_timeline_of_the_profiled_steps(tmp_path):
    profiler = MemoryProfiler(enable=True, start_step=1, end_step=3, output_dir=str(tmp_path), rank=0)
    train_steps(profiler)
    timeline = json.loads((tmp_path / "memory_timeline_rank0.json").read_text())
    activation_bytes = ACTIVATION[0] * ACTIVATION[1] * 4
    assert timeline["peak_allocated_bytes"] >= activation_bytes
    assert any(e["bytes"] == activation_bytes for e in timeline["events"])  # that activation's allocation...
    assert any(e["bytes"] == -activation_bytes for e in timeline["events"])  # ... and its free
    assert "[memory]" in event_names(tmp_path / "memory_trace_rank0.json")
    rss = json.loads((tmp_path / "memory_rank0.json").read_text())
    assert [r["step"] for r in rss] == [1, 2] and all(r["peak_rss_bytes"] > 0 for r in rss)


class ProfilerActivity(enum.Enum):
    """The stand-in's activities: the pinned names."""

    CPU = "CPU"
    NPU = "NPU"


@pytest.fixture
def standin_torch_npu(monkeypatch):  # noqa: ANN001, ANN201
    """A torch_npu STAND-IN (profiler + npu.memory, bound through the pinned real signatures) for one
    test: its profiler records CPU ops with torch's own profiler (there is no NPU here)."""
    assert tuple(a.name for a in ProfilerActivity) == PINS.PROFILER_ACTIVITIES
    npu = types.ModuleType("torch_npu")
    npu.calls = []

    class Profile:
        def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
            options = PINS.bind(PINS.PROFILE, args, kwargs)
            npu.calls.append(("profile", options))
            assert all(isinstance(a, ProfilerActivity) for a in options["activities"])
            self.cpu = torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=options["record_shapes"],
                with_stack=options["with_stack"],
            )  # fmt: skip

        def __enter__(self):  # noqa: ANN204
            self.cpu.__enter__()
            return self

        def __exit__(self, *exc) -> None:  # noqa: ANN002
            self.cpu.__exit__(*exc)

        def export_chrome_trace(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
            path = PINS.bind(PINS.EXPORT_CHROME_TRACE, args, kwargs)["output_path"]
            npu.calls.append(("export_chrome_trace", path))
            self.cpu.export_chrome_trace(path)

    def record_memory_history(*args, **kwargs) -> None:  # noqa: ANN002, ANN003
        npu.calls.append(
            ("record_memory_history", PINS.bind(PINS.RECORD_MEMORY_HISTORY, args, kwargs)["enabled"])
        )

    def dump_snapshot(*args, **kwargs) -> None:  # noqa: ANN002, ANN003
        filename = PINS.bind(PINS.DUMP_SNAPSHOT, args, kwargs)["filename"]
        npu.calls.append(("dump_snapshot", filename))
        Path(filename).write_bytes(pickle.dumps({"segments": [], "device_traces": [[]]}))

    npu.profiler = types.SimpleNamespace(profile=Profile, ProfilerActivity=ProfilerActivity)
    memory = types.SimpleNamespace(_record_memory_history=record_memory_history, _dump_snapshot=dump_snapshot)
    npu.npu = types.SimpleNamespace(memory=memory)
    monkeypatch.setitem(sys.modules, "torch_npu", npu)
    return npu


def test_on_npu_both_profilers_use_torch_npu_s_profiler_and_memory_snapshot(tmp_path, standin_torch_npu):
    common = {"enable": True, "start_step": 1, "end_step": 3, "rank": 0, "device_type": "npu"}
    trace = StepProfiler(output_dir=str(tmp_path / "profile"), record_shapes=True, **common)
    memory = MemoryProfiler(output_dir=str(tmp_path / "memory"), **common)
    train_steps(trace, memory)
    calls = standin_torch_npu.calls
    (_, options), export = calls[0], calls[2]
    assert options["activities"] == [ProfilerActivity.CPU, ProfilerActivity.NPU] and options["record_shapes"]
    snapshot = tmp_path / "memory" / "memory_snapshot_rank0.pickle"
    assert [c[0] for c in calls] == [
        "profile", "record_memory_history", "export_chrome_trace", "dump_snapshot", "record_memory_history",
    ]  # fmt: skip
    assert calls[1][1] == "all" and calls[3][1] == str(snapshot) and calls[4][1] is None  # on, dump, off
    assert export[1] == str(tmp_path / "profile" / "trace_rank0.json")
    assert {"train_step_1", "aten::addmm"} <= event_names(Path(export[1])) and snapshot.is_file()
