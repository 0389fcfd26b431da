"""Non-finite state is never committed: a due save waits for a step whose loss and parameters are
finite, and a run that ends on a non-finite state fails instead of reporting success. Skipped steps
name their samples, and ``max_skipped`` caps them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from mm_trainer import MetricsLogger, NonFiniteLossError, TrainEngine
from torch import nn


class Poisoned(nn.Module):
    """loss = w * mean(x); at forward call ``nan_at`` the loss is NaN, at call ``inf_at`` the weight
    becomes inf after the (finite) loss is computed."""

    def __init__(self, nan_at: int = 0, inf_at: int = 0) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(()))
        self.nan_at, self.inf_at, self.calls = nan_at, inf_at, 0

    def forward(self, x: torch.Tensor, rng=None) -> SimpleNamespace:
        self.calls += 1
        loss = self.w * x.mean() * (float("nan") if self.calls == self.nan_at else 1.0)
        if self.calls == self.inf_at:
            with torch.no_grad():
                self.w.fill_(float("inf"))
        return SimpleNamespace(loss=loss)


class Batches:
    """Two samples a step, with their global sample ids."""

    def __init__(self) -> None:
        self.step = 0

    def next_batch(self) -> dict:
        self.step += 1
        return {"x": torch.ones(2, 4), "sample_ids": torch.tensor([2 * self.step - 2, 2 * self.step - 1])}


def _train(model: Poisoned, saved: list[int], *, iters: int = 4, **nonfinite) -> int:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    policy = {"action": "skip", "max_consecutive": 3, "max_skipped": None, **nonfinite}
    engine = TrainEngine(
        model=model, optimizer=optimizer, lr_scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0),
        batches=Batches(), device=torch.device("cpu"), save_fn=saved.append,
        metrics=MetricsLogger(total_steps=iters),  # its lines go to stderr
        training=SimpleNamespace(
            gradient_accumulation_steps=1, clip_grad=0.0, train_iters=iters, log_interval=1, save_interval=2,
            nonfinite=SimpleNamespace(**policy), seed=0, log_sample_ids=False,
        ),
    )  # fmt: skip
    return engine.train()


def test_a_due_save_after_a_non_finite_loss_waits_for_the_next_finite_step(capsys):
    saved: list[int] = []
    assert _train(Poisoned(nan_at=2), saved) == 4
    assert saved == [3, 4]
    err = capsys.readouterr().err
    assert "not saving iteration 2: the step's loss is not finite (on this rank: nan)" in err
    assert (
        "step 2: non-finite loss nan / grad norm nan: step skipped (1 in a row, 1 in all); its samples: global sample ids [2, 3]"
        in err
    )


def test_non_finite_parameters_are_never_saved_and_a_run_ending_on_them_fails(capsys):
    saved: list[int] = []
    with pytest.raises(
        NonFiniteLossError, match="reached training.train_iters=4 with a non-finite last step"
    ):
        _train(Poisoned(inf_at=2), saved)
    assert saved == []
    assert "not saving iteration 2: 1 parameter shard(s) hold NaN or inf" in capsys.readouterr().err


class NaNAt(Poisoned):
    """A NaN loss at each forward call in ``calls``."""

    def __init__(self, calls: set[int]) -> None:
        super().__init__()
        self.nan_calls = calls

    def forward(self, x: torch.Tensor, rng=None) -> SimpleNamespace:
        self.nan_at = self.calls + 1 if self.calls + 1 in self.nan_calls else 0
        return super().forward(x, rng)


def test_max_skipped_stops_the_run_naming_every_skipped_steps_samples():
    with pytest.raises(NonFiniteLossError) as failure:
        _train(
            NaNAt({2, 4}), [], iters=6, max_skipped=1
        )  # never two in a row: max_consecutive is not reached
    message = str(failure.value)
    assert "max_skipped=1" in message and "(1 in a row, 2 in all)" in message
    assert "Skipped steps: step 2: global sample ids [2, 3]; step 4: global sample ids [6, 7]" in message
    assert "resume from it with a lower training.lr" in message
