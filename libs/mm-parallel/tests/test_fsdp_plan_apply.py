"""apply_fsdp_plan on the toy container at world size 2 (real gloo groups)."""

from __future__ import annotations

import pytest
import torch
from mm_parallel import FSDPPlan, ParallelState, apply_fsdp_plan, set_gradient_sync
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

GLOBAL_BATCH = 4
STEPS = 5


def _train(model, batches, step_fn) -> list[float]:
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for batch in batches:
        opt.zero_grad()
        losses.append(step_fn(model, batch))
        opt.step()
    return losses


def _train_sharded(model, toy, rank: int, world: int) -> list[float]:
    """STEPS steps on this rank's slice of each global batch; the losses averaged over ranks."""

    def step(m, batch):
        loss = m(**toy.shard_batch(batch, rank, world))
        loss.backward()
        mean = loss.detach().clone()
        torch.distributed.all_reduce(mean, op=torch.distributed.ReduceOp.AVG)
        return mean.item()

    return _train(model, [toy.make_batch(GLOBAL_BATCH, seed=s) for s in range(STEPS)], step)


def _reference_losses(toy) -> list[float]:
    model = toy.make_container()
    batches = [toy.make_batch(GLOBAL_BATCH, seed=s) for s in range(STEPS)]

    def step(m, batch):
        loss = m(**batch)
        loss.backward()
        return loss.item()

    return _train(model, batches, step)


@pytest.mark.slow
def test_toy_container_at_world_2(distributed, toy) -> None:
    def run(rank: int, world: int) -> dict:
        model = toy.make_container()
        plan = FSDPPlan.from_dict(toy.plan())
        report = apply_fsdp_plan(model, plan, ParallelState())
        kinds = {
            name: (type(p).__name__ if not isinstance(p, DTensor) else "DTensor", p.dtype)
            for name, p in model.named_parameters()
        }

        return {"report": report, "kinds": kinds, "losses": _train_sharded(model, toy, rank, world)}

    results = distributed(run, 2)
    report, kinds = results[0]["report"], results[0]["kinds"]

    # 1. Units follow the patterns in post-order, then the predictor's fallback unit.
    assert report.unit_paths == [
        "text_encoder",
        "predictor.blocks.0",
        "predictor.blocks.1",
        "predictor.blocks.2",
        "predictor.head",
        "predictor",
    ]
    assert [u.kind for u in report.units] == ["pattern"] * 5 + ["fallback"]
    assert report.units[-1].num_params == 2  # predictor.in_proj weight + bias
    # 2. The ignored ae stays plain fp32 tensors; everything else is sharded.
    assert report.ignored_params == ["ae.encoder.bias", "ae.encoder.weight"]
    assert all(kinds[n] == ("Parameter", torch.float32) for n in report.ignored_params)
    assert all(kind == "DTensor" for n, (kind, _) in kinds.items() if not n.startswith("ae."))
    # 3. Same losses as the unwrapped model on one process with the same global batch.
    torch.testing.assert_close(results[0]["losses"], _reference_losses(toy), rtol=1e-5, atol=0)
    assert results[0]["losses"] == results[1]["losses"]


@pytest.mark.slow
def test_prefetch_lists_stay_inside_each_sub_model(distributed, toy) -> None:
    def run(rank: int, world: int):
        model = toy.make_container()
        plan = FSDPPlan.from_dict(toy.plan(num_to_forward_prefetch=2, num_to_backward_prefetch=2))
        report = apply_fsdp_plan(model, plan, ParallelState())
        model(**toy.shard_batch(toy.make_batch(4), rank, world)).backward()  # prefetch runs cleanly
        return report

    report = distributed(run, 2)[0]
    owner = {u.path: u.owner for u in report.units}
    assert report.forward_prefetch["predictor.blocks.2"] == ["predictor.head"]
    assert report.forward_prefetch["predictor"] == ["predictor.blocks.0", "predictor.blocks.1"]
    assert report.backward_prefetch["predictor.head"] == ["predictor.blocks.2", "predictor.blocks.1"]
    assert "text_encoder" not in report.forward_prefetch  # alone in its sub-model
    for lists in (report.forward_prefetch, report.backward_prefetch):
        for source, targets in lists.items():
            assert all(owner[t] == owner[source] for t in targets), (source, targets)


@pytest.mark.slow
def test_bf16_params_with_fp32_reduce_keep_fp32_shards(distributed, toy) -> None:
    def run(rank: int, world: int) -> dict:
        model = toy.make_container()
        plan = FSDPPlan.from_dict(toy.plan(param_dtype="bf16", reduce_dtype="fp32"))
        apply_fsdp_plan(model, plan, ParallelState())
        seen = {}

        def record(module, args) -> None:
            seen["compute"] = module.mlp[0].weight.dtype

        model.predictor.blocks[0].register_forward_pre_hook(record)
        loss = model(**toy.shard_batch(toy.make_batch(4), rank, world))
        loss.backward()
        return {
            "loss": loss.item(),
            "compute": seen["compute"],
            "shards": {p.dtype for n, p in model.named_parameters()},
            "grads": {p.grad.dtype for p in model.parameters() if p.grad is not None},
        }

    out = distributed(run, 2)[0]
    assert out["compute"] == torch.bfloat16  # gathered for compute in bf16
    assert out["shards"] == {torch.float32}  # sharded (and ignored) params stay fp32
    assert out["grads"] == {torch.float32}
    assert torch.isfinite(torch.tensor(out["loss"]))


@pytest.mark.slow
def test_gradient_sync_off_until_last_microstep_matches_one_big_step(distributed, toy) -> None:
    batch = toy.make_batch(8)
    reference = toy.make_container()
    halves = [{k: v[:4] for k, v in batch.items()}, {k: v[4:] for k, v in batch.items()}]
    (sum(reference(**h) for h in halves) / 2).backward()
    expected = {n: p.grad for n, p in reference.named_parameters() if p.grad is not None}

    def run(rank: int, world: int) -> dict:
        model = toy.make_container()
        apply_fsdp_plan(model, FSDPPlan.from_dict(toy.plan()), ParallelState())
        reduced_early = []
        for i, half in enumerate(halves):
            set_gradient_sync(model, is_last_microstep=i == len(halves) - 1)
            (model(**toy.shard_batch(half, rank, world)) / len(halves)).backward()
            reduced_early.append(any(p.grad is not None for p in model.predictor.parameters()))
        grads = {n: p.grad.full_tensor() for n, p in model.named_parameters() if p.grad is not None}
        return reduced_early, toy.to_numpy(grads)

    reduced, grads = distributed(run, 2)[0]
    assert reduced == [False, True]  # no reduce-scatter until the last micro-step
    assert grads.keys() == expected.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(torch.from_numpy(grad), expected[name], rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.slow
def test_meta_model_is_sharded_before_materialization_with_cpu_offload(distributed, toy) -> None:
    def run(rank: int, world: int) -> dict:
        with torch.device("meta"):
            model = toy.make_container()
        plan = FSDPPlan.from_dict(
            toy.plan(cpu_offload=True, sub_plans={"text_encoder": {"cpu_offload": False}})
        )
        apply_fsdp_plan(model, plan, ParallelState())
        head = model.predictor.head.weight
        layout = (head.device.type, tuple(head.to_local().shape), tuple(head.shape))
        model.to_empty(device="cpu")
        with torch.no_grad():  # no random init: DTensor's random ops are not rank-coordinated on a CPU mesh
            for param in model.parameters():
                param.fill_(0.1)
        loss = model(**toy.shard_batch(toy.make_batch(4), rank, world))
        loss.backward()
        return {
            "layout": layout,
            "loss": loss.item(),
            "grad_device": model.predictor.head.weight.grad.device.type,
            "offloaded": _offloaded_parameters(model),
        }

    out = distributed(run, 2)[0]
    assert out["layout"] == ("meta", (4, 8), (8, 8))
    assert out["grad_device"] == "cpu" and torch.isfinite(
        torch.tensor(out["loss"])
    )  # telling on accelerators
    # what FSDP was told, per sub-model (on CPU the device alone cannot show it): the plan's
    # cpu_offload for the predictor, the sub-plan's override for the text encoder
    assert out["offloaded"] == {"predictor": {True}, "text_encoder": {False}}


def _offloaded_parameters(model) -> dict[str, set[bool]]:
    """``{sub-model: {whether FSDP keeps its parameter shards on the host}}`` over its FSDP units."""
    out: dict[str, set[bool]] = {}
    for path, module in model.named_modules():
        group = module._get_fsdp_state()._fsdp_param_group if isinstance(module, FSDPModule) else None
        for param in group.fsdp_params if group else ():
            out.setdefault(path.split(".")[0], set()).add(param.offload_to_cpu)
    return out


def _pending_all_gather(module) -> bool:
    # FSDP2 internals: an issued, not yet waited-for all-gather of the module's own parameters
    return module._get_fsdp_state()._fsdp_param_group._all_gather_result is not None


@pytest.mark.slow
def test_cross_submodel_prefetch_gathers_the_next_sub_model_while_the_current_one_runs(
    distributed, toy
) -> None:
    def run(rank: int, world: int, order: list[str]) -> dict:
        model = toy.make_container()
        report = apply_fsdp_plan(
            model, FSDPPlan.from_dict(toy.plan(cross_submodel_prefetch=order)), ParallelState()
        )
        pending = []
        model.text_encoder.register_forward_hook(
            lambda *a: pending.append(_pending_all_gather(model.predictor))
        )

        return {
            "pairs": report.cross_submodel_prefetch,
            "pending": pending,
            "losses": _train_sharded(model, toy, rank, world),
        }

    crossed = distributed(run, 2, ["text_encoder", "predictor"])[0]
    plain = distributed(run, 2, [])[0]
    assert crossed["pairs"] == {"text_encoder": "predictor"}
    assert crossed["pending"] == [False] + [True] * (
        STEPS - 1
    )  # installed after the predictor's first forward
    assert plain["pending"] == [False] * STEPS
    torch.testing.assert_close(crossed["losses"], _reference_losses(toy), rtol=1e-5, atol=0)


def test_cross_submodel_prefetch_of_a_sub_model_without_units_is_refused_before_wrapping(
    distributed, toy
) -> None:
    def run(rank: int, world: int) -> str:
        model = toy.make_container()
        plan = FSDPPlan.from_dict(toy.plan(cross_submodel_prefetch=["ae", "predictor"]))
        with pytest.raises(ValueError, match=r"'ae' is not a sub-model with FSDP units; sub-models with units: "
                                             r"\['predictor', 'text_encoder'\]"):  # fmt: skip
            apply_fsdp_plan(model, plan, ParallelState())
        assert not any(isinstance(p, DTensor) for p in model.parameters())
        return "ok"

    assert distributed(run, 2) == ["ok", "ok"]
