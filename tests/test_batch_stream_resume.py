"""`BatchStream` state: a resume continues the loader position and the epoch's bad-sample count."""

from __future__ import annotations

import pytest
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


def stream(dp_rank: int = 0, dp_size: int = 1, global_batch_size: int = 2, micro: int = 2) -> BatchStream:
    loader = build_dataloader(
        ReportsSkipped(), global_batch_size=global_batch_size, micro_batch_size=micro, dp_rank=dp_rank,
        dp_size=dp_size, seed=0, collate_fn=collate,
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


def test_each_batch_carries_the_global_sample_ids_of_its_samples():
    batches = stream()
    ids = [batches.next_batch()["sample_ids"].tolist() for _ in range(13)]  # into the second epoch
    assert ids == [[2 * i, 2 * i + 1] for i in range(13)]


def test_states_of_two_ranks_resume_four_ranks_at_the_next_step_with_the_bad_samples_on_rank_0():
    old = [stream(r, 2, global_batch_size=4) for r in range(2)]
    seen = [run(batches, 4) for batches in old]  # 4 steps of 4 samples: 2 of the 3 bad ones seen
    assert sum(steps[-1][1] for steps in seen) == 2
    new = [stream(r, 4, global_batch_size=4, micro=1) for r in range(4)]
    for rank, batches in enumerate(new):
        batches.load_rank_states([b.state_dict() for b in old], dp_rank=rank, dp_size=4)
    assert [b.bad_this_epoch for b in new] == [2, 0, 0, 0]  # summed over ranks: each counted once
    next_step = [x for b in new for x in b.next_batch()["x"].tolist()]
    assert next_step == [x for b in old for x in b.next_batch()["x"].tolist()]


def test_ranks_that_saved_different_positions_are_an_inconsistent_data_state():
    ahead, behind = stream(0, 2, global_batch_size=4), stream(1, 2, global_batch_size=4)
    run(ahead, 2)
    run(behind, 1)
    with pytest.raises(
        ValueError, match="inconsistent data state: dp rank 0 saved position .* dp rank 1 saved"
    ):
        stream().load_rank_states([ahead.state_dict(), behind.state_dict()], dp_rank=0, dp_size=1)


@pytest.mark.parametrize("bad", [[-1], ["103"], 103])
def test_saved_bad_samples_that_are_not_sample_indices_are_refused(bad):
    first = stream()
    run(first, 4)
    state = {**first.state_dict(), "bad_samples": bad}
    with pytest.raises(ValueError, match="expected a list of sample indices"):
        stream().load_state_dict(state)
