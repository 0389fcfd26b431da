"""Packed attention over real gloo groups equals each sample's attention alone on one process.

Four samples of uneven lengths (13, 5, 22 and 1 tokens: every one needs padding for the CP degree, the
last has fewer tokens than ranks) are packed into one sequence, split with ``split_packed`` and attended
with ``ulysses_attention`` / ``ring_attention`` / ``usp_attention(packed=...)``; the reference runs
torch SDPA on each sample alone, in float64. Outputs are compared on the real tokens (a pad token
attends the padding of its sample), the q, k and v gradients everywhere (padding gets none). One
launch per world size (2: Ulysses 2, Ring 2 in both layouts, with the math kernel and with a kernel
that runs several segment pairs in ONE call, as the CUDA / NPU varlen kernels do; 4: USP 2 x 2 in both
layouts, Ulysses 4, Ring 4, and ``SequenceParallelPlan`` with a packed stream) reports every check; the
tests read the reports.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from mm_parallel import (
    AttentionBackend,
    PackedSequence,
    SequenceParallelPlan,
    gather_packed,
    get_backend,
    register_backend,
    ring_attention,
    split_packed,
    ulysses_attention,
    usp_attention,
)
from torch.distributed.device_mesh import init_device_mesh

pytestmark = pytest.mark.slow

B, H, D = 2, 4, 8
PACKED = PackedSequence((13, 5, 22, 1))
TOL = 1e-12
CASES_2 = ("ulysses2", "ring2-zigzag", "ring2-contiguous", "ring2-zigzag-math", "ring2-zigzag-onecall")
ONE_CALL = "onecall"  # a test kernel registered in the worker processes only
CASES_4 = ("usp2x2-zigzag", "usp2x2-contiguous", "ulysses4", "ring4-zigzag")


def _block_diagonal(q_lengths: tuple[int, ...], k_lengths: tuple[int, ...]) -> torch.Tensor:
    """``[Tq, Tk]`` bool: query segment j attends to key segment j."""
    rows = torch.repeat_interleave(torch.arange(len(q_lengths)), torch.tensor(q_lengths))
    cols = torch.repeat_interleave(torch.arange(len(k_lengths)), torch.tensor(k_lengths))
    return rows[:, None] == cols[None, :]


def _register_one_call_kernel(calls: list[int]) -> None:
    """A CPU kernel whose varlen entry runs every segment pair of a block in one (block-masked math) call,
    like flash_attn's / the NPU's varlen kernels; ``calls`` records the pairs of each call."""
    math = get_backend("math")

    def forward(q, k, v, q_lengths, k_lengths, *, scale):  # noqa: ANN001, ANN202
        calls.append(len(q_lengths))
        return math.forward(q, k, v, attn_mask=_block_diagonal(q_lengths, k_lengths), scale=scale)

    def backward(dout, q, k, v, out, lse, q_lengths, k_lengths, *, scale):  # noqa: ANN001, ANN202
        mask = _block_diagonal(q_lengths, k_lengths)
        return math.backward(dout, q, k, v, out, lse, attn_mask=mask, scale=scale)

    register_backend(
        AttentionBackend(
            ONE_CALL, math.forward, True, True, lambda: True, math.backward, (), "test: varlen in one call",
            varlen_forward=forward, varlen_backward=backward,
        )
    )  # fmt: skip


def _inputs() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(B, PACKED.total, H, D, generator=gen, dtype=torch.float64) for _ in range(4)]


def _per_sample_reference(q, k, v, dout) -> list[torch.Tensor]:  # noqa: ANN001
    """SDPA on each sample alone: [out, dq, dk, dv] of the packed tensors."""
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    outs = [
        F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in sample)).transpose(1, 2)
        for sample in zip(*(PACKED.unpack(t, 1) for t in leaves), strict=True)
    ]
    out = torch.cat(outs, 1)
    out.backward(dout)
    return [out.detach()] + [t.grad for t in leaves]


def _groups(case: str, world: int):  # noqa: ANN202
    """(ulysses group, ring group, layout, backend) of a case."""
    kind, *rest = case.split("-")
    layout = rest[0] if rest else "contiguous"
    backend = rest[1] if len(rest) > 1 else None
    if kind.startswith("usp"):
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("ring", "ulysses"))
        return mesh.get_group("ulysses"), mesh.get_group("ring"), layout, backend
    group = init_device_mesh("cpu", (world,), mesh_dim_names=("cp",)).get_group("cp")
    return (group, None, layout, backend) if kind.startswith("ulysses") else (None, group, layout, backend)


def _attend(case: str, local: list[torch.Tensor], ug, rg, layout: str, backend: str | None) -> torch.Tensor:  # noqa: ANN001
    if case.startswith("ulysses"):
        return ulysses_attention(*local, ug, packed=PACKED)
    if case.startswith("ring"):
        return ring_attention(*local, rg, layout=layout, packed=PACKED, backend=backend)
    return usp_attention(*local, ug, rg, layout=layout, packed=PACKED)


def _attention_case(case: str, world: int) -> dict[str, float]:
    ug, rg, layout, backend = _groups(case, world)
    q, k, v, dout = _inputs()
    expected = _per_sample_reference(q, k, v, dout)
    split = lambda t: split_packed(t, 1, PACKED, ug, rg, layout)  # noqa: E731
    local = [split(t).requires_grad_() for t in (q, k, v)]
    out = _attend(case, local, ug, rg, layout, backend)
    out.backward(split(dout))
    real = split(torch.ones(1, PACKED.total, dtype=torch.bool))[0]
    got = [out.detach()[:, real]] + [t.grad for t in local]
    want = [split(expected[0])[:, real]] + [split(g) for g in expected[1:]]
    names = ("out", "dq", "dk", "dv")
    report = {f"{case}-{n}": (g - w).abs().max().item() for n, g, w in zip(names, got, want, strict=True)}
    report[f"{case}-pads"] = int((~real).sum())  # the split padded this rank's share
    return report


def _plan_case(world: int) -> dict[str, float | bool]:
    """SequenceParallelPlan over USP 2 x 2 with a packed stream: split, attention, gather, valid mask."""
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("ring", "ulysses"))
    plan = SequenceParallelPlan(mesh.get_group("ulysses"), mesh.get_group("ring"), "zigzag")
    plan.pack(PACKED)
    q, k, v, dout = _inputs()
    local = [plan.split(t, 1) for t in (q, k, v)]
    full = plan.gather(plan.attention(*local), 1, PACKED.total)
    x = torch.randn(3, PACKED.total, 5, dtype=torch.float64)
    ug, rg = plan.ulysses_group, plan.ring_group
    return {
        "plan-attention": (full - _per_sample_reference(q, k, v, dout)[0]).abs().max().item(),
        "plan-split-is-split_packed": torch.equal(local[0], split_packed(q, 1, PACKED, ug, rg, "zigzag")),
        "plan-gather-of-split-is-bit-exact": torch.equal(plan.gather(plan.split(x, 1), 1, PACKED.total), x),
        "plan-valid-mask": torch.equal(
            plan.valid_mask(),
            split_packed(torch.ones(PACKED.total, dtype=torch.bool), 0, PACKED, ug, rg, "zigzag"),
        ),
        "gather_packed-of-split_packed-is-bit-exact": torch.equal(
            gather_packed(split_packed(x, 1, PACKED, ug, rg, "contiguous"), 1, PACKED, ug, rg, "contiguous"),
            x,
        ),
    }


def _worker(rank: int, world: int) -> dict[str, float | bool]:
    report: dict[str, float | bool] = {}
    calls: list[int] = []
    _register_one_call_kernel(calls)
    for case in CASES_2 if world == 2 else CASES_4:
        report.update(_attention_case(case, world))
    report["onecall-most-pairs-in-one-call"] = max(calls, default=0)
    if world == 4:
        report.update(_plan_case(world))
    return report


_REPORTS: dict[int, dict[str, float | bool]] = {}


def _report(distributed, world: int) -> dict[str, float | bool]:  # noqa: ANN001
    if world not in _REPORTS:
        reports = distributed(_worker, world)
        merged: dict[str, float | bool] = {}
        for key in reports[0]:
            values = [r[key] for r in reports]
            merged[key] = all(values) if isinstance(values[0], bool) else max(values)
        _REPORTS[world] = merged
    return _REPORTS[world]


@pytest.mark.parametrize("case", CASES_2)
def test_packed_attention_on_two_ranks_equals_each_sample_alone_forward_and_backward(
    distributed, case: str
) -> None:  # noqa: ANN001
    report = _report(distributed, 2)
    errors = {n: report[f"{case}-{n}"] for n in ("out", "dq", "dk", "dv")}
    assert max(errors.values()) <= TOL, errors
    assert report[f"{case}-pads"] > 0  # some rank held padding: the uneven lengths were padded
    if case.endswith(ONE_CALL):
        assert report["onecall-most-pairs-in-one-call"] > 1  # the kernel got several segment pairs at once


@pytest.mark.parametrize("case", CASES_4)
def test_packed_attention_on_four_ranks_equals_each_sample_alone_forward_and_backward(
    distributed, case: str
) -> None:  # noqa: ANN001
    report = _report(distributed, 4)
    errors = {n: report[f"{case}-{n}"] for n in ("out", "dq", "dk", "dv")}
    assert max(errors.values()) <= TOL, errors
    assert report[f"{case}-pads"] > 0


def test_sequence_parallel_plan_splits_attends_and_gathers_a_packed_stream(distributed) -> None:  # noqa: ANN001
    report = _report(distributed, 4)
    assert report["plan-attention"] <= TOL
    checks = [k for k in report if k.startswith(("plan-", "gather_packed")) and k != "plan-attention"]
    assert len(checks) == 4
    assert [k for k in checks if report[k] is not True] == []
