"""Bad samples are counted over every DataLoader worker and data-parallel rank, not per process."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from mm_data import (
    BadSampleError,
    VideoTextDataset,
    build_dataloader,
    collate_video_text,
    make_synthetic_dataset,
)
from mm_trainer import BatchStream, TrainEngine
from torch import nn

pytestmark = pytest.mark.slow


class MeanModel(nn.Module):
    """loss = (w * mean(video) - 1)^2: something to step on."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(()))

    def forward(self, video: torch.Tensor, **_: object) -> SimpleNamespace:
        return SimpleNamespace(loss=(self.w * video.mean() - 1) ** 2)


def training(iters: int) -> SimpleNamespace:
    return SimpleNamespace(
        gradient_accumulation_steps=1, clip_grad=0.0, train_iters=iters, log_interval=1, save_interval=0,
        nonfinite=SimpleNamespace(action="skip", max_consecutive=3), seed=0, log_sample_ids=False,
    )  # fmt: skip


def _train(rank: int, world: int, clips: str, max_bad_fraction: float) -> str:
    dataset = VideoTextDataset(clips, num_frames=9, height=16, width=16, max_bad_fraction=max_bad_fraction)
    loader = build_dataloader(
        dataset, global_batch_size=4, micro_batch_size=2, dp_rank=rank, dp_size=world, seed=0,
        num_workers=2, collate_fn=collate_video_text,
    )  # fmt: skip
    model = MeanModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    engine = TrainEngine(
        model=model, optimizer=optimizer, lr_scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0),
        batches=BatchStream(loader), training=training(len(dataset) // 4), device=torch.device("cpu"),
        dp_group=dist.group.WORLD,
    )  # fmt: skip
    try:
        engine.train()
    except BadSampleError as exc:
        return str(exc)
    return "finished"


def spread_bad_clips(metadata: Path, num_bad: int, every: int) -> str:
    """Reorder the rows so the corrupt clips (written last) sit ``every`` rows apart."""
    rows = json.loads(metadata.read_text())
    good, bad = rows[:-num_bad], rows[-num_bad:]
    for i, row in enumerate(bad):
        good.insert(i * every + 2, row)
    metadata.write_text(json.dumps(good))
    return str(metadata)


def test_a_run_stops_when_all_ranks_and_workers_together_pass_the_bad_sample_limit(tmp_path, distributed):
    metadata = make_synthetic_dataset(tmp_path, num_clips=16, corrupt=4, sizes=((16, 16),), num_frames=(9,))
    clips = spread_bad_clips(metadata, num_bad=4, every=5)  # 4 bad of 20, one epoch = 5 steps of 4
    # 0.15 allows 3: each of the 4 loader processes (2 ranks x 2 workers) sees fewer, together they see 4
    (first, second) = distributed(_train, 2, clips, 0.15)
    assert first == second
    assert first.startswith(
        "4 bad samples so far this epoch across all data-parallel ranks and loader workers"
    )
    assert distributed(_train, 2, clips, 0.2) == ["finished", "finished"]  # 0.2 allows 4
