"""Sub-plans and HSDP at world size 4 (real gloo groups)."""

from __future__ import annotations

import pytest
import torch
from mm_parallel import FSDPPlan, ParallelState, apply_fsdp_plan
from torch.distributed.tensor import DTensor

GLOBAL_BATCH = 8
STEPS = 3


@pytest.mark.slow
def test_frozen_text_encoder_on_2_ranks_is_resharded_after_forward(distributed, toy) -> None:
    def run(rank: int, world: int) -> dict:
        model = toy.make_container()
        plan = FSDPPlan.from_dict(
            toy.plan(
                ignored_modules=[],
                sub_plans={"text_encoder": {"shard_size": 2}, "ae": {"enabled": False}},
            )
        )
        report = apply_fsdp_plan(model, plan, ParallelState())
        full = {n: p.numel() for n, p in model.text_encoder.named_parameters()}
        with torch.no_grad():
            for _ in range(2):  # steady state, not only the first (lazy-init) forward
                model(**toy.shard_batch(toy.make_batch(GLOBAL_BATCH), rank, world))
        local = {n: p.to_local().numel() for n, p in model.text_encoder.named_parameters()}
        return {
            "meshes": {u.path: u.mesh_shape for u in report.units},
            "full": full,
            "local": local,
            "ae_plain": not any(isinstance(p, DTensor) for p in model.ae.parameters()),
            "replicated": report.replicated_params,
            "resharded_roots": report.resharded_roots,
        }

    out = distributed(run, 4)[0]
    assert out["meshes"]["text_encoder"] == (2, 2)  # 2 replicas x 2 shards
    assert out["meshes"]["predictor"] == (4,)
    assert out["meshes"]["predictor.blocks.0"] == (4,)
    assert out["ae_plain"] and out["replicated"] == ["ae.encoder.weight", "ae.encoder.bias"]
    assert out["resharded_roots"] == ["text_encoder"]
    assert out["local"] == {n: numel // 2 for n, numel in out["full"].items()}


def _hsdp_run(toy, parallel_kwargs: dict, sub_plans: dict):
    def run(rank: int, world: int) -> dict:
        model = toy.make_container()
        plan = FSDPPlan.from_dict(toy.plan(sub_plans=sub_plans))
        report = apply_fsdp_plan(model, plan, ParallelState(**parallel_kwargs))
        opt = torch.optim.SGD(model.predictor.parameters(), lr=0.1)
        losses, first_grads = [], None
        for step in range(STEPS):
            opt.zero_grad()
            loss = model(**toy.shard_batch(toy.make_batch(GLOBAL_BATCH, seed=step), rank, world))
            loss.backward()
            if first_grads is None:
                first_grads = {n: p.grad.full_tensor() for n, p in model.predictor.named_parameters()}
            total = loss.detach().clone()
            torch.distributed.all_reduce(total, op=torch.distributed.ReduceOp.AVG)
            losses.append(total.item())
            opt.step()
        weights = {n: p.full_tensor() for n, p in model.predictor.named_parameters()}
        return {
            "mesh": report.units[-1].mesh_shape,
            "losses": losses,
            "grads": toy.to_numpy(first_grads),
            "weights": toy.to_numpy(weights),
        }

    return run


@pytest.mark.slow
def test_hsdp_predictor_matches_fsdp_over_4(distributed, toy) -> None:
    fsdp = distributed(_hsdp_run(toy, {}, {}), 4)
    sub_plan_hsdp = distributed(_hsdp_run(toy, {}, {"predictor": {"shard_size": 2}}), 4)
    global_hsdp = distributed(_hsdp_run(toy, {"dp_replicate": 2}, {}), 4)

    assert fsdp[0]["mesh"] == (4,)
    assert sub_plan_hsdp[0]["mesh"] == global_hsdp[0]["mesh"] == (2, 2)
    for hsdp in (sub_plan_hsdp, global_hsdp):
        torch.testing.assert_close(hsdp[0]["losses"], fsdp[0]["losses"], rtol=1e-5, atol=0)
        for name, grad in fsdp[0]["grads"].items():
            torch.testing.assert_close(
                torch.from_numpy(hsdp[0]["grads"][name]), torch.from_numpy(grad), rtol=1e-5, atol=1e-7
            )
        # replicas never diverge: every rank holds the same full weights
        for rank_out in hsdp[1:]:
            for name, weight in hsdp[0]["weights"].items():
                assert (rank_out["weights"][name] == weight).all(), name


@pytest.mark.slow
def test_reshard_hook_reshards_a_frozen_root_that_fsdp_leaves_gathered(distributed) -> None:
    from mm_parallel.sub_plans import reshard_after_each_forward
    from torch import nn
    from torch.distributed.fsdp import fully_shard

    def run(rank: int, world: int) -> dict:
        out = {}
        for with_hook in (False, True):
            torch.manual_seed(0)
            model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 4)).requires_grad_(False)
            fully_shard(model[0])
            fully_shard(model)  # auto reshard_after_forward: FSDP keeps a root gathered
            if with_hook:
                reshard_after_each_forward(model)
            with torch.no_grad():
                model(torch.ones(2, 4))
            out[with_hook] = isinstance(model[1].weight, DTensor)
        return out

    assert distributed(run, 2)[0] == {False: False, True: True}
