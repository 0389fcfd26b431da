"""USP (Ulysses x Ring) on 4 gloo processes: split/gather round trips and attention vs full SDPA.

One 4-process launch builds several meshes (u2 x r2 in both mesh orders, u1 x r4, u4 x r1) and
reports every check; the parametrized tests read the reports.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from mm_parallel import (
    ParallelState,
    SequenceParallelPlan,
    gather_for_usp,
    split_for_usp,
    split_sequence,
    usp_attention,
    usp_padded_length,
)
from torch.distributed.device_mesh import init_device_mesh

B, H, D = 2, 4, 8
TOL = {torch.float32: 1e-5, torch.float64: 1e-10}
MESHES = {  # name -> (mesh shape, dim names); the product is the 4-process world
    "u2r2": ((2, 2), ("ring", "ulysses")),
    "u2r2-ulysses-major": ((2, 2), ("ulysses", "ring")),
    "u1r4": ((4, 1), ("ring", "ulysses")),
    "u4r1": ((1, 4), ("ring", "ulysses")),
}
CASES = list(
    itertools.product(
        ("u2r2", "u2r2-ulysses-major"),
        (torch.float32, torch.float64),
        (False, True),
        ("contiguous", "zigzag"),
        (False, True),
    )
)
CASES += [
    (mesh, torch.float64, causal, "zigzag", True) for mesh in ("u1r4", "u4r1") for causal in (False, True)
]


def _case_id(case: tuple) -> str:
    mesh, dtype, causal, layout, padded = case
    return f"{mesh}-{str(dtype)[6:]}-{'causal' if causal else 'full'}-{layout}-{'pad' if padded else 'nopad'}"


def _groups() -> dict[str, tuple[dist.ProcessGroup, dist.ProcessGroup]]:
    out = {}
    for name, (shape, names) in MESHES.items():
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
        out[name] = (mesh.get_group("ulysses"), mesh.get_group("ring"))
    return out


def _reference(q, k, v, dout, valid, causal: bool) -> list[torch.Tensor]:  # noqa: ANN001
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    mask = valid[:, None, None, :]
    if causal:
        mask = mask & torch.ones(q.size(1), q.size(1), dtype=torch.bool).tril()
    out = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), attn_mask=mask).transpose(
        1, 2
    )
    out.backward(dout)
    return [out.detach(), q.grad, k.grad, v.grad]


def _attention_case(case: tuple, ug: dist.ProcessGroup, rg: dist.ProcessGroup) -> float:
    _, dtype, causal, layout, padded = case
    length = 29 if padded else 32  # 29 tokens are padded to a multiple of ring chunks x ulysses
    full_len = usp_padded_length(length, ug, rg, layout)
    gen = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(B, full_len, H, D, generator=gen, dtype=dtype) for _ in range(4))
    valid = torch.arange(full_len)[None, :] < torch.tensor([[length], [length - 9]])  # batch 1: more padding
    expected = [split_for_usp(t, 1, ug, rg, layout) for t in _reference(q, k, v, dout, valid, causal)]
    local = [split_for_usp(t, 1, ug, rg, layout).requires_grad_() for t in (q, k, v)]
    kpm = split_for_usp(valid, 1, ug, rg, layout)
    out = usp_attention(*local, ug, rg, causal=causal, layout=layout, key_padding_mask=kpm)
    out.backward(split_for_usp(dout, 1, ug, rg, layout))
    got = [out.detach()] + [t.grad for t in local]
    return max((g - e).abs().max().item() for g, e in zip(got, expected, strict=True))


def _usp_worker(rank: int, world: int) -> dict[str, float | bool]:
    groups = _groups()
    report: dict[str, float | bool] = {}
    for case in CASES:
        report[_case_id(case)] = _attention_case(case, *groups[case[0]])
    for (name, (ug, rg)), layout, length in itertools.product(
        groups.items(), ("contiguous", "zigzag"), (32, 29, 5)
    ):
        x = torch.randn(3, length, 2, generator=torch.Generator().manual_seed(length))
        back = gather_for_usp(
            split_for_usp(x, 1, ug, rg, layout, pad=True), 1, ug, rg, layout, seq_len=length
        )
        report[f"roundtrip-{name}-{layout}-L{length}"] = torch.equal(back, x)
    x = torch.randn(2, 16, 3)
    ug, rg = groups["u2r2"]
    same = torch.equal(split_for_usp(x, 1, ug, rg, "contiguous"), split_sequence(x, 1, dist.group.WORLD))
    report["contiguous-usp-equals-ring-major-cp-split"] = same
    state = ParallelState(world_size=world, ulysses=2, ring=2)
    for layout, length in itertools.product(("contiguous", "zigzag"), (29, 32)):
        report.update(_plan_case(state, layout, length))
    return report


def _plan_case(state: ParallelState, layout: str, length: int) -> dict[str, float | bool]:
    """``SequenceParallelPlan`` over the state's groups: the split is ``split_for_usp(pad=True)``,
    the valid mask the split of an all-True mask, attention over the real keys only."""
    plan = SequenceParallelPlan.from_parallel_state(state, layout)
    ug, rg = state.ulysses_group, state.ring_group
    gen = torch.Generator().manual_seed(length)
    q, k, v = (torch.randn(B, length, H, D, generator=gen, dtype=torch.float64) for _ in range(3))
    local = [plan.split(t, 1) for t in (q, k, v)]
    valid = plan.valid_mask()
    expected = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v))).transpose(1, 2)
    out = plan.attention(*local)
    tag = f"plan-{layout}-L{length}"
    return {
        f"{tag}-split": torch.equal(local[0], split_for_usp(q, 1, ug, rg, layout, pad=True)),
        f"{tag}-valid-mask": torch.equal(
            valid, split_for_usp(torch.ones(length, dtype=torch.bool), 0, ug, rg, layout, pad=True)
        ),
        f"{tag}-key-len": plan.key_len() == (None if length == plan.padded_length(length) else length),
        f"{tag}-attention": (out[:, valid] - split_for_usp(expected, 1, ug, rg, layout, pad=True)[:, valid])
        .abs()
        .max()
        .item(),
        f"{tag}-gather": torch.equal(
            plan.gather(out, 1, length), gather_for_usp(out, 1, ug, rg, layout, seq_len=length)
        ),
    }


_REPORTS: dict[str, float | bool] = {}


def _reports(distributed) -> dict[str, float | bool]:  # noqa: ANN001
    if not _REPORTS:
        reports = distributed(_usp_worker, 4)
        for key in reports[0]:
            values = [r[key] for r in reports]
            _REPORTS[key] = all(values) if isinstance(values[0], bool) else max(values)
    return _REPORTS


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_usp_attention_matches_full_sdpa_outputs_and_grads(distributed, case: tuple) -> None:  # noqa: ANN001
    assert _reports(distributed)[_case_id(case)] < TOL[case[1]]


@pytest.mark.slow
def test_split_for_usp_then_gather_for_usp_is_bit_exact(distributed) -> None:  # noqa: ANN001
    trips = {k: v for k, v in _reports(distributed).items() if k.startswith("roundtrip-")}
    assert len(trips) == len(MESHES) * 2 * 3
    assert [k for k, ok in trips.items() if not ok] == []


@pytest.mark.slow
def test_contiguous_usp_split_equals_split_over_ring_major_cp_group(distributed) -> None:  # noqa: ANN001
    assert _reports(distributed)["contiguous-usp-equals-ring-major-cp-split"] is True


@pytest.mark.slow
def test_sequence_parallel_plan_splits_masks_and_gathers_like_the_usp_functions(distributed) -> None:  # noqa: ANN001
    checks = {
        k: v
        for k, v in _reports(distributed).items()
        if k.startswith("plan-") and not k.endswith("-attention")
    }
    assert len(checks) == 2 * 2 * 4
    assert [k for k, ok in checks.items() if not ok] == []


@pytest.mark.slow
def test_sequence_parallel_plan_attention_over_padded_keys_matches_full_sdpa(distributed) -> None:  # noqa: ANN001
    errors = {
        k: v for k, v in _reports(distributed).items() if k.startswith("plan-") and k.endswith("-attention")
    }
    assert len(errors) == 4
    assert max(errors.values()) < TOL[torch.float64]


def test_usp_attention_without_groups_is_plain_attention() -> None:
    q, k, v = (torch.randn(1, 6, 2, 8, dtype=torch.float64) for _ in range(3))
    expected = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=True)
    torch.testing.assert_close(usp_attention(q, k, v, None, None, causal=True), expected.transpose(1, 2))
