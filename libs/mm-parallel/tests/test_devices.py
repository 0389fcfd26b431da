"""Device detection and process-group initialization."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from mm_parallel import get_device_type, get_dist_backend
from mm_parallel.devices import DEVICE_ENV_VAR

INIT_SCRIPT = textwrap.dedent(
    """
    import torch.distributed as dist
    from mm_parallel import init_distributed
    rank, world = init_distributed()
    print(rank, world, dist.get_backend(), init_distributed() == (rank, world))
    """
)


def test_override_and_environment_variable_win(monkeypatch) -> None:
    assert get_device_type("npu") == "npu"
    monkeypatch.setenv("MM_PARALLEL_DEVICE", "cuda")
    assert get_device_type() == "cuda"
    assert get_device_type("cpu") == "cpu"


def test_detection_falls_back_to_cpu_without_accelerators(monkeypatch) -> None:
    monkeypatch.delenv("MM_PARALLEL_DEVICE", raising=False)
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    assert get_device_type() in ("cpu", "npu")


def test_unknown_device_is_rejected() -> None:
    with pytest.raises(ValueError, match="'tpu' is not supported"):
        get_device_type("tpu")


def test_backends() -> None:
    assert [get_dist_backend(d) for d in ("npu", "cuda", "cpu")] == ["hccl", "nccl", "gloo"]


# An Ascend stack stand-in: a ``torch_npu`` package that does what the real one does on import
# (name the privateuse1 backend "npu", register ``torch.npu``), with a device count set by the
# test and ``set_device`` calls recorded. It runs in a subprocess: the renaming is process-wide.
FAKE_TORCH_NPU = textwrap.dedent(
    """
    import os, types, torch
    torch.utils.rename_privateuse1_backend("npu")
    npu = types.ModuleType("torch.npu")
    npu.is_available = lambda: int(os.environ["FAKE_NPU_COUNT"]) > 0
    npu.set_device = lambda device: print("set_device", device)
    torch._register_device_module("npu", npu)
    """
)
NPU_SCRIPT = textwrap.dedent(
    """
    from mm_parallel import get_device_type, get_local_device, init_distributed
    print("detected", get_device_type())
    if get_device_type() == "npu":
        print("local", get_local_device())
        print("group", init_distributed(backend="gloo"))
    """
)


def _run_with_fake_npu(tmp_path, npus: int) -> list[str]:
    (tmp_path / "torch_npu").mkdir()
    (tmp_path / "torch_npu" / "__init__.py").write_text(FAKE_TORCH_NPU)
    clean = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", DEVICE_ENV_VAR)}
    path = os.pathsep.join([str(tmp_path), clean.get("PYTHONPATH", "")])
    env = {**clean, "PYTHONPATH": path, "FAKE_NPU_COUNT": str(npus), "LOCAL_RANK": "1"}
    done = subprocess.run(
        [sys.executable, "-c", NPU_SCRIPT], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("torch_npu") is not None, reason="a real torch_npu is installed")
def test_an_ascend_device_is_detected_and_each_rank_takes_its_local_npu(tmp_path) -> None:
    assert _run_with_fake_npu(tmp_path, npus=2) == [
        "detected npu",
        "local npu:1",  # LOCAL_RANK
        "set_device npu:1",  # selected before the process group starts
        "group (0, 1)",
    ]


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("torch_npu") is not None, reason="a real torch_npu is installed")
def test_torch_npu_without_a_device_falls_back(tmp_path) -> None:
    detected = _run_with_fake_npu(tmp_path, npus=0)
    assert detected == ["detected cuda" if torch.cuda.is_available() else "detected cpu"]


def _run(env: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return subprocess.run(
        [sys.executable, "-c", INIT_SCRIPT],
        env={**clean, "MM_PARALLEL_DEVICE": "cpu", **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_single_process_without_torchrun_gets_a_world_1_group() -> None:
    done = _run({})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "1", "gloo", "True"]


@pytest.mark.slow
def test_torchrun_environment_initializes_every_rank() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    common = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": "2"}
    clean = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", INIT_SCRIPT],
            env={**clean, "MM_PARALLEL_DEVICE": "cpu", **common, "RANK": str(r), "LOCAL_RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in outputs]
    assert [out.split() for out, _ in outputs] == [["0", "2", "gloo", "True"], ["1", "2", "gloo", "True"]]
