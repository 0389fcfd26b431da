"""clip_grad_norm_ over 1-D FSDP, HSDP and replicated parameters vs the unsharded model."""

from __future__ import annotations

import math

import pytest
import torch
from mm_parallel import FSDPPlan, ParallelState, apply_fsdp_plan, clip_grad_norm_
from torch import nn

MAX_NORM = 0.05


def _reference(model: nn.Module, batch: dict, norm_type: float) -> tuple[float, dict]:
    model(**batch).backward()
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, MAX_NORM, norm_type=norm_type)
    return norm.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_plain_tensors_without_process_group_match_torch(toy) -> None:
    for norm_type in (2.0, 1.0, math.inf):
        expected_norm, expected = _reference(toy.make_container(), toy.make_batch(4), norm_type)
        model = toy.make_container()
        model(**toy.make_batch(4)).backward()
        norm = clip_grad_norm_(model.parameters(), MAX_NORM, norm_type)
        torch.testing.assert_close(norm.item(), expected_norm, rtol=1e-6, atol=0)
        for name, p in model.named_parameters():
            if p.grad is not None:
                torch.testing.assert_close(p.grad, expected[name], rtol=1e-6, atol=0)


def test_non_finite_norm_is_returned_and_grads_are_left_alone(caplog) -> None:
    weight = nn.Parameter(torch.ones(3))
    weight.grad = torch.tensor([1.0, float("nan"), 2.0])
    norm = clip_grad_norm_([weight], max_norm=1.0)
    assert torch.isnan(norm)
    assert "not clipped" in caplog.text
    assert weight.grad[0] == 1.0 and weight.grad[2] == 2.0
    with pytest.raises(RuntimeError, match="gradient norm is nan"):
        clip_grad_norm_([weight], max_norm=1.0, error_if_nonfinite=True)


def test_zero_max_norm_only_computes() -> None:
    weight = nn.Parameter(torch.ones(2))
    weight.grad = torch.tensor([3.0, 4.0])
    assert clip_grad_norm_([weight], max_norm=0.0).item() == 5.0
    assert weight.grad.tolist() == [3.0, 4.0]


@pytest.mark.slow
def test_norm_over_fsdp_hsdp_and_replicated_params_equals_unsharded(distributed, toy) -> None:
    trainable = ("predictor", "text_encoder", "ae")
    batch = toy.make_batch(4)  # every rank sees the same batch, so averaged grads = reference grads
    references = {
        norm_type: _reference(toy.make_container(trainable=trainable), batch, norm_type)
        for norm_type in (2.0, math.inf)
    }

    def run(rank: int, world: int) -> dict:
        out = {}
        for norm_type in (2.0, math.inf):
            model = toy.make_container(trainable=trainable)
            plan = FSDPPlan.from_dict(
                toy.plan(
                    ignored_modules=[],
                    sub_plans={
                        "predictor": {"shard_size": 2},  # HSDP 2 x 2
                        "ae": {"enabled": False},  # trainable + replicated: (4, 1) mesh
                    },
                )
            )
            report = apply_fsdp_plan(model, plan, ParallelState())
            model(**batch).backward()
            norm = clip_grad_norm_(model.parameters(), MAX_NORM, norm_type)
            grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
            out[norm_type] = (norm.item(), toy.to_numpy(grads), {u.owner: u.mesh_shape for u in report.units})
        return out

    results = distributed(run, 4)
    for norm_type, (expected_norm, expected_grads) in references.items():
        norm, grads, meshes = results[0][norm_type]
        assert meshes == {"text_encoder": (4,), "predictor": (2, 2), "ae": (4, 1)}
        assert all(r[norm_type][0] == norm for r in results)
        torch.testing.assert_close(norm, expected_norm, rtol=1e-6, atol=0)
        for name, grad in grads.items():
            torch.testing.assert_close(torch.from_numpy(grad), expected_grads[name], rtol=1e-5, atol=1e-8)
