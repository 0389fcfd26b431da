"""An optimizer that has not stepped some (or all) of its parameters has no state for them: a checkpoint
holds none, and a load gives them none, at any layout (a phased run: one expert's student not yet
updated, a phase that has not yet run)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from mm_checkpoint import DistributedCheckpointer
from torch import nn


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.ModuleDict({"high": nn.Linear(8, 8), "low": nn.Linear(8, 8)})


def _step(model: nn.Module, optimizer: torch.optim.Optimizer, which: str, seed: int) -> float:
    """One step that trains ``which`` expert only (the other gets no gradient, as a two-expert student)."""
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(seed))
    loss = model[which](x).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


def test_parameters_their_optimizer_never_stepped_save_and_load_without_state(tmp_path: Path) -> None:
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    _step(model, optimizer, "high", 1)
    DistributedCheckpointer(tmp_path).save({"model": model, "optimizer": optimizer}, 1)
    assert len(optimizer.state) == 2  # high.weight, high.bias; low: none

    resumed = _model()
    resumed_optimizer = torch.optim.AdamW(resumed.parameters(), lr=0.1)
    DistributedCheckpointer(tmp_path).load({"model": resumed, "optimizer": resumed_optimizer})
    assert {id(p) for p in resumed_optimizer.state} == {id(resumed["high"].weight), id(resumed["high"].bias)}
    # both go on alike, the low expert's first step included
    for seed, which in ((2, "low"), (3, "high"), (4, "low")):
        assert _step(resumed, resumed_optimizer, which, seed) == _step(model, optimizer, which, seed)
    for a, b in zip(model.parameters(), resumed.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_saved_optimizer_that_never_stepped_keeps_no_state_and_loads_none(tmp_path: Path) -> None:
    model = _model()
    stepped = torch.optim.AdamW(model["high"].parameters(), lr=0.1)
    waiting = torch.optim.AdamW(model["low"].parameters(), lr=0.1)  # a phase that has not run yet
    _step(model, stepped, "high", 1)
    DistributedCheckpointer(tmp_path).save({"model": model, "optimizer": [stepped, waiting]}, 1)
    assert not waiting.state  # saving gave it none (no zero-lr step counted)

    resumed = _model()
    optimizers = [torch.optim.AdamW(resumed["high"].parameters(), lr=0.1),
                  torch.optim.AdamW(resumed["low"].parameters(), lr=0.1)]  # fmt: skip
    DistributedCheckpointer(tmp_path).load({"model": resumed, "optimizer": optimizers})
    assert len(optimizers[0].state) == 2 and not optimizers[1].state
    assert _step(resumed, optimizers[1], "low", 2) == _step(model, waiting, "low", 2)
    torch.testing.assert_close(resumed["low"].weight, model["low"].weight, rtol=0, atol=0)


def test_a_parameter_with_part_of_its_state_missing_is_an_error(tmp_path: Path) -> None:
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    _step(model, optimizer, "high", 1)
    _step(model, optimizer, "low", 2)
    del optimizer.state[model["low"].weight]["exp_avg_sq"]  # a checkpoint missing one moment
    DistributedCheckpointer(tmp_path).save({"model": model, "optimizer": optimizer}, 1)
    resumed = _model()
    with pytest.raises(Exception, match=r"optimizer\.state\.low\.weight\.exp_avg_sq"):
        DistributedCheckpointer(tmp_path).load(
            {"model": resumed, "optimizer": torch.optim.AdamW(resumed.parameters(), lr=0.1)}
        )


@pytest.mark.slow
def test_a_partly_stepped_optimizer_saved_at_two_ranks_loads_at_one(distributed, tmp_path: Path) -> None:
    def body(rank: int, world: int) -> None:
        from torch.distributed.fsdp import fully_shard

        model = _model()
        for name in ("high", "low"):
            fully_shard(model[name])
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
        _step(model, optimizer, "high", 1)
        DistributedCheckpointer(tmp_path).save({"model": model, "optimizer": optimizer}, 1)

    distributed(body, 2)
    reference = _model()
    reference_optimizer = torch.optim.AdamW(reference.parameters(), lr=0.1)
    _step(reference, reference_optimizer, "high", 1)
    resumed = _model()
    resumed_optimizer = torch.optim.AdamW(resumed.parameters(), lr=0.1)
    DistributedCheckpointer(tmp_path).load({"model": resumed, "optimizer": resumed_optimizer})
    assert len(resumed_optimizer.state) == 2
    for seed, which in ((2, "low"), (3, "high")):
        want = _step(reference, reference_optimizer, which, seed)
        assert _step(resumed, resumed_optimizer, which, seed) == pytest.approx(want, rel=1e-6)
