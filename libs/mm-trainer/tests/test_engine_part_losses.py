"""A pipeline's ``loss_<part>`` metrics (LTX-2's ``loss_video`` / ``loss_audio``) reach the step's record,
averaged over the micro-steps as ``loss`` is."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from mm_trainer import TrainEngine
from torch import nn


class TwoPartLoss(nn.Module):
    """loss = a + b, both reported; micro-step ``k`` (1-based) gives ``a = k``, ``b = 10 k``."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(()))
        self.calls = 0

    def forward(self, x: torch.Tensor) -> SimpleNamespace:
        self.calls += 1
        a, b = float(self.calls), 10.0 * self.calls
        return SimpleNamespace(
            loss=self.w * (a + b) * x.mean(), metrics={"loss_a": a, "loss_b": b, "flops": 1.0}
        )


class Ones:
    def next_batch(self) -> dict:
        return {"x": torch.ones(2, 4)}


def test_the_pipelines_part_losses_are_averaged_over_micro_steps_into_the_record():
    model = TwoPartLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    engine = TrainEngine(
        model=model, optimizer=optimizer, lr_scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0),
        batches=Ones(), device=torch.device("cpu"),
        training=SimpleNamespace(
            gradient_accumulation_steps=3, clip_grad=0.0, train_iters=1, log_interval=1, save_interval=100,
            nonfinite=SimpleNamespace(action="skip", max_consecutive=3), seed=0, log_sample_ids=False,
        ),
    )  # fmt: skip
    result = engine.train_step(0)
    assert result.logged == {"loss_a": 2.0, "loss_b": 20.0}  # (1 + 2 + 3) / 3
    assert result.loss == 22.0
    record = engine._metrics(result, elapsed=1.0)
    assert record["loss_a"] == 2.0 and record["loss_b"] == 20.0
