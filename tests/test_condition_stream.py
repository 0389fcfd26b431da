"""`ConditionStream` (features.condition_micro_steps): conditions encoded N micro-steps ahead, one encoder run per
micro-batch inside a context-parallel group, and a saved position that resumes exactly."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from mm_data import build_dataloader
from mm_trainer import BatchStream, ConditionStream
from torch.utils.data import Dataset, default_collate


class Numbers(Dataset):
    """Sample i: features = i * ones(4), so every batch says which samples it holds."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> dict:
        return {"features": torch.full((4,), float(i)), "index": i}


def stream(seed: int = 0) -> BatchStream:
    loader = build_dataloader(
        Numbers(), global_batch_size=2, micro_batch_size=2, dp_rank=0, dp_size=1, seed=seed,
        collate_fn=default_collate,
    )  # fmt: skip
    return BatchStream(loader)


class CountingEncoder:
    """``encode(batch)`` -> {"cond": linear(features), "index": ...}; remembers what it encoded."""

    def __init__(self, linear: torch.nn.Module) -> None:
        self.linear, self.seen = linear, []

    def __call__(self, batch: dict) -> dict:
        self.seen.append(batch["index"].tolist())
        with torch.no_grad():
            return {"cond": self.linear(batch["features"]), "index": batch["index"], "tag": "ok"}


def linear() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(4, 3)


def test_conditions_arrive_in_batch_order_and_equal_a_direct_encode():
    encoder, direct, raw = CountingEncoder(linear()), CountingEncoder(linear()), stream()
    ahead = ConditionStream(stream(), encoder, micro_steps=3, device=torch.device("cpu"))
    for step in range(7):
        got = ahead.next_batch()["conditions"]
        want = direct(raw.next_batch())
        assert torch.equal(got["cond"], want["cond"]) and torch.equal(got["index"], want["index"])
        assert got["tag"] == "ok"
        assert len(encoder.seen) == 3 * (step // 3 + 1)  # a whole group is encoded at its first step


def test_the_saved_position_is_after_the_last_micro_batch_handed_out_and_resumes_there():
    ahead = ConditionStream(stream(), CountingEncoder(linear()), micro_steps=4, device=torch.device("cpu"))
    raw = stream()
    for _ in range(3):
        ahead.next_batch()
        raw.next_batch()
    state = ahead.state_dict()
    assert state == raw.state_dict()  # same format and value as the plain stream: mid-group, 1 slot unused

    resumed = ConditionStream(stream(), CountingEncoder(linear()), micro_steps=4, device=torch.device("cpu"))
    resumed.load_state_dict(state)
    expected = raw.next_batch()["index"]
    assert torch.equal(resumed.next_batch()["conditions"]["index"], expected)


def test_conditions_that_require_grad_are_refused():
    def trainable_encoder(batch: dict) -> dict:
        return {"cond": batch["features"].requires_grad_()}

    ahead = ConditionStream(stream(), trainable_encoder, micro_steps=2, device=torch.device("cpu"))
    with pytest.raises(ValueError, match=r"conditions \['cond'\] require grad"):
        ahead.next_batch()


def test_micro_steps_must_be_a_multiple_of_the_group_size(distributed):
    def body(rank, world_size):
        with pytest.raises(ValueError, match="must be a positive multiple of the context-parallel size 2"):
            ConditionStream(
                stream(), lambda b: b, micro_steps=3, device=torch.device("cpu"), cp_group=dist.group.WORLD
            )
        return "ok"

    assert distributed(body, 2) == ["ok", "ok"]


def _context_parallel_group(rank: int, world_size: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    encoder_module = linear()
    fully_shard(encoder_module, mesh=init_device_mesh("cpu", (world_size,)))  # every encode is collective
    encoder = CountingEncoder(encoder_module)
    ahead = ConditionStream(
        stream(), encoder, micro_steps=4, device=torch.device("cpu"), cp_group=dist.group.WORLD
    )
    got = [ahead.next_batch()["conditions"] for _ in range(8)]
    encoded_by_me = list(encoder.seen)
    raw = stream()
    want = [encoder(raw.next_batch()) for _ in range(8)]  # every rank encodes every batch: the reference
    return {
        "encoded": encoded_by_me,
        "equal": all(
            torch.equal(g["cond"], w["cond"]) and torch.equal(g["index"], w["index"])
            for g, w in zip(got, want)
        ),
        "indices": [g["index"].tolist() for g in got],
    }


@pytest.mark.slow
def test_each_rank_of_a_context_parallel_group_encodes_only_its_slots_and_all_get_every_condition(
    distributed,
):
    ranks = distributed(_context_parallel_group, 2)
    all_batches = ranks[0]["indices"]
    assert ranks[1]["indices"] == all_batches and len({tuple(b) for b in all_batches}) == 8
    for rank, result in enumerate(ranks):
        assert result["equal"], f"rank {rank}: conditions differ from a direct encode"
        mine = [b for slot, b in enumerate(all_batches) if slot % 4 % 2 == rank]
        assert result["encoded"] == mine  # micro-batches 0, 2 of each group on rank 0; 1, 3 on rank 1
