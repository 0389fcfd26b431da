"""`BatchStream` state: a resume continues the loader position and the epoch's bad-sample count."""

from __future__ import annotations

import torch
from mm_data import build_dataloader
from mm_trainer import BatchStream
from torch.utils.data import Dataset

BAD_AFTER = {3: 103, 10: 110, 17: 117}  # sample i reports that the dataset passed over sample j


class ReportsSkipped(Dataset):
    """24 samples; three of them carry ``skipped`` like mm-data items that replaced a bad clip."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> dict:
        return {"x": torch.tensor(float(i)), "skipped": [BAD_AFTER[i]] if i in BAD_AFTER else []}


def collate(items: list[dict]) -> dict:
    return {"x": torch.stack([it["x"] for it in items]), "skipped": [it["skipped"] for it in items]}


def stream() -> BatchStream:
    loader = build_dataloader(
        ReportsSkipped(), global_batch_size=2, micro_batch_size=2, dp_rank=0, dp_size=1, seed=0,
        collate_fn=collate,
    )  # fmt: skip
    return BatchStream(loader)


def run(batches: BatchStream, steps: int) -> list[tuple[list[float], int]]:
    out = []
    for _ in range(steps):
        batch = batches.next_batch()
        out.append((batch["x"].tolist(), batches.bad_this_epoch))
    return out


def test_a_resumed_stream_continues_the_batches_and_the_bad_sample_count():
    whole = run(stream(), 14)  # one epoch is 12 micro-batches; two more start the next
    first = stream()
    head = run(first, 5)
    resumed = stream()
    resumed.load_state_dict(first.state_dict())
    assert resumed.bad_this_epoch == head[-1][1]
    assert head + run(resumed, 9) == whole


def test_the_bad_sample_count_restarts_with_the_next_epoch_after_a_resume():
    whole = run(stream(), 14)
    assert whole[11][1] == len(BAD_AFTER)
    assert whole[12][1] < len(BAD_AFTER)  # counting restarted


def test_a_bare_loader_state_from_before_bad_samples_were_saved_still_loads():
    first = stream()
    run(first, 4)
    legacy = first.state_dict()["loader"]
    resumed = stream()
    resumed.load_state_dict(legacy)
    assert resumed.bad_this_epoch == 0
    assert run(resumed, 1)[0][0] == run(first, 1)[0][0]
