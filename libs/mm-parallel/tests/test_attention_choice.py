"""Which kernel ring attention runs its blocks on: auto rules, explicit choices, refusals, warnings."""

from __future__ import annotations

import logging

import pytest
import torch
from mm_parallel import resolve_attention_backend, use_attention_backend
from mm_parallel.attention_backends import get_backend
from mm_parallel.attention_choice import warn_if_math_on_accelerator
from mm_parallel.attention_memory import math_score_bytes
from torch._subclasses.fake_tensor import FakeTensorMode


@pytest.mark.parametrize(("device", "kernel"), [("cpu", "cpu_flash"), ("cuda", "flash")])
def test_auto_picks_the_fused_kernel_of_the_device(device: str, kernel: str) -> None:
    choice = resolve_attention_backend("auto", device)
    assert choice.backend == kernel and choice.reason.startswith("auto")


@pytest.mark.parametrize("device", ["npu", "xpu"])
def test_auto_without_a_fused_kernel_for_an_accelerator_warns_before_picking_math(
    device: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="mm_parallel"):
        choice = resolve_attention_backend("auto", device)
    assert choice.backend == "math"
    assert "materializes [B, H, Sq, Sk] float32 scores" in caplog.text


def test_an_explicit_choice_names_its_source_in_the_reason() -> None:
    choice = resolve_attention_backend("efficient", "cuda")
    assert choice.backend == "efficient" and "parallel.attention_backend" in str(choice)


def test_a_cuda_kernel_on_a_cpu_run_is_refused_naming_the_ones_that_run_there() -> None:
    with pytest.raises(ValueError, match=r"runs on \['cuda'\].*'cpu'.*cpu_flash"):
        resolve_attention_backend("flash", "cpu")


def test_a_kernel_without_lse_is_refused_for_ring_blocks() -> None:
    with pytest.raises(ValueError, match="sdpa.*LSE"):
        resolve_attention_backend("sdpa", "cpu")


def test_an_unknown_kernel_name_lists_the_registered_ones() -> None:
    with pytest.raises(KeyError, match="registered: .*flash"):
        resolve_attention_backend("xformers", "cuda")


def test_the_npu_kernel_is_unavailable_without_torch_npu() -> None:
    with pytest.raises(RuntimeError, match="'npu' is not available"):
        resolve_attention_backend("npu", "npu")


def test_the_run_choice_is_what_ring_attention_uses_on_that_device() -> None:
    from mm_parallel.attention_choice import ring_kernel

    try:
        use_attention_backend("math", "cpu")
        assert ring_kernel(torch.device("cpu")).name == "math"
    finally:
        use_attention_backend("auto", "cpu")
    assert ring_kernel(torch.device("cpu")).name == "cpu_flash"


def test_math_on_an_accelerator_states_the_bytes_of_its_score_tensors(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with FakeTensorMode():
        q = torch.empty(1, 16384, 10, 128, device="cuda", dtype=torch.bfloat16)
    with caplog.at_level(logging.WARNING, logger="mm_parallel"):
        warn_if_math_on_accelerator(get_backend("math"), q, q)
    one = math_score_bytes(1, 10, 16384, 16384, torch.bfloat16)
    assert one == 10 * 2**30  # 10 GiB: 1 x 10 x 16384 x 16384 float32
    assert (
        "[1, 10, 16384, 16384]" in caplog.text and "10.00 GiB" in caplog.text and "40.00 GiB" in caplog.text
    )


def test_math_on_the_cpu_warns_nothing(caplog: pytest.LogCaptureFixture) -> None:
    q = torch.empty(1, 8, 2, 4)
    with caplog.at_level(logging.WARNING, logger="mm_parallel"):
        warn_if_math_on_accelerator(get_backend("math"), q, q)
    assert caplog.text == ""
