import itertools
import re

import numpy as np
import pytest
import torch
from mm_data import GlobalOrderSampler, build_dataloader

N, GBS, SEED = 53, 8, 7
BUCKETS = np.random.default_rng(0).integers(0, 3, N).tolist()


class IndexDataset(torch.utils.data.Dataset):
    """Returns its index: lets tests read the sample order through a real DataLoader."""

    def __init__(self, n: int = N, buckets=BUCKETS) -> None:
        self.n, self.bucket_ids = n, list(buckets)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return int(i)


def samplers(dp_size: int, micro: int, **kw) -> list[GlobalOrderSampler]:
    return [
        GlobalOrderSampler(
            N,
            global_batch_size=GBS,
            dp_rank=r,
            dp_size=dp_size,
            seed=SEED,
            micro_batch_size=micro,
            buckets=BUCKETS,
            **kw,
        )
        for r in range(dp_size)
    ]


def global_steps(rank_batches: list[list[list[int]]], accum: int) -> list[list[int]]:
    """Per optimizer step: concatenation over dp ranks of their accum micro-batches."""
    steps = []
    for s in range(len(rank_batches[0]) // accum):
        steps.append([i for batches in rank_batches for b in batches[s * accum : (s + 1) * accum] for i in b])
    return steps


def run(samplers_: list[GlobalOrderSampler], num_micro: int | None = None) -> list[list[list[int]]]:
    return [list(itertools.islice(iter(s), num_micro)) for s in samplers_]


def test_global_batches_never_mix_buckets_and_cover_each_sample_once():
    (s,) = samplers(1, GBS)
    batches = s.global_batches(0)
    assert all(len({BUCKETS[i] for i in b}) == 1 for b in batches)
    flat = [i for b in batches for i in b]
    assert len(flat) == len(set(flat)) and len(batches) == sum(c // GBS for c in np.bincount(BUCKETS))


@pytest.mark.parametrize(("dp_size", "micro"), [(2, 4), (4, 2), (2, 1), (4, 1)])
def test_global_order_is_independent_of_dp_size_and_accumulation(dp_size: int, micro: int):
    reference = run(samplers(1, GBS))[0]
    parallel = run(samplers(dp_size, micro))
    accum = GBS // (dp_size * micro)
    assert all(len(b) == micro for rank in parallel for b in rank)
    assert global_steps(parallel, accum) == reference


def test_context_parallel_ranks_of_one_dp_group_get_the_same_batches():
    world, cp = 4, 2
    per_rank = [run([samplers(world // cp, 2)[rank // cp]])[0] for rank in range(world)]
    assert per_rank[0] == per_rank[1] and per_rank[2] == per_rank[3] and per_rank[0] != per_rank[2]
    assert global_steps([per_rank[0], per_rank[2]], 2) == run(samplers(1, GBS))[0]


@pytest.mark.slow
def test_gloo_world_4_with_cp_2_reads_the_world_1_order(distributed):
    def body(rank: int, world: int) -> list[list[int]]:
        import torch.distributed as dist

        cp = 2
        s = GlobalOrderSampler(
            N, global_batch_size=GBS, dp_rank=rank // cp, dp_size=world // cp, seed=SEED, buckets=BUCKETS
        )
        mine = list(s)
        gathered = [None] * world
        dist.all_gather_object(gathered, mine)
        return gathered

    gathered = distributed(body, 4)[0]
    assert gathered[0] == gathered[1] and gathered[2] == gathered[3]
    assert global_steps([gathered[0], gathered[2]], 1) == run(samplers(1, GBS))[0]


@pytest.mark.parametrize(("dp_size", "micro"), [(1, GBS), (2, 2), (4, 1)])
def test_sample_ids_count_the_global_order_at_any_layout(dp_size: int, micro: int):
    parallel = samplers(dp_size, micro)
    accum = parallel[0].accumulation_steps
    per_epoch = parallel[0].batches_per_epoch
    for epoch in (0, 2):
        for step in range(per_epoch):
            ids = [
                i
                for s in parallel
                for offset in range(accum)
                for i in s.sample_ids_at(epoch, step * accum + offset)
            ]
            first = (epoch * per_epoch + step) * GBS
            assert ids == list(range(first, first + GBS))


def test_batches_per_epoch_counts_what_an_epoch_yields():
    for drop_last in (True, False):
        (s,) = samplers(1, GBS, drop_last=drop_last)
        assert s.batches_per_epoch == len(s.global_batches(0)) == len(s.global_batches(3))


def test_the_loader_reports_the_sample_ids_of_the_batch_it_handed_out():
    (loader,) = make_loaders(1, 2, workers=0)
    for position, _ in enumerate(itertools.islice(iter(loader), 6)):
        assert loader.last_sample_ids == [2 * position, 2 * position + 1]


def test_resume_mid_step_needs_the_same_layout():
    (s,) = samplers(1, 2)
    run([s], 3)  # 3 of the 4 micro-batches of step 1
    state = s.state_dict()
    assert (state["consumed_samples"], state["micro_offset"]) == (0, 3)
    same = samplers(1, 2)[0]
    same.load_state_dict(state)
    assert next(iter(same)) == s.rank_micro_batches(s.global_batches(0)[0])[3]
    with pytest.raises(ValueError, match="resume at a step boundary"):
        samplers(2, 2)[0].load_state_dict(state)


def test_state_of_another_seed_is_rejected():
    state = samplers(1, GBS)[0].state_dict()
    other = GlobalOrderSampler(N, global_batch_size=GBS, dp_rank=0, dp_size=1, seed=SEED + 1, buckets=BUCKETS)
    with pytest.raises(ValueError, match="seed=7 but this sampler has 8"):
        other.load_state_dict(state)


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("consumed_samples", -8, "consumed_samples=-8; expected an integer in [0, 40]"),
        ("consumed_samples", 48, "consumed_samples=48; expected an integer in [0, 40]"),
        ("consumed_samples", 8.0, "consumed_samples=8.0; expected an integer"),
        ("epoch", -1, "epoch=-1; expected an integer >= 0"),
        ("micro_offset", -1, "micro_offset=-1; expected an integer >= 0"),
        ("micro_offset", 4, "micro_offset=4; a step of this sampler has 4 micro-batches"),
    ],
)
def test_a_position_the_sampler_cannot_be_at_is_refused(key, value, expected):
    state = {**samplers(1, 2)[0].state_dict(), key: value}
    with pytest.raises(ValueError, match=re.escape(expected)):
        samplers(1, 2)[0].load_state_dict(state)


def test_epochs_differ_and_iteration_advances_the_epoch():
    (s,) = samplers(1, GBS)
    first = list(s)
    assert s.epoch == 1 and s.state_dict()["consumed_samples"] == 0
    second = list(s)
    assert first != second and sorted(map(sorted, first)) != sorted(map(sorted, second))
    s.set_epoch(0)
    assert list(s) == first


def test_drop_last_false_pads_each_bucket_to_full_batches():
    (s,) = samplers(1, GBS, drop_last=False)
    batches = s.global_batches(0)
    assert all(len(b) == GBS and len({BUCKETS[i] for i in b}) == 1 for b in batches)
    assert set(itertools.chain(*batches)) == set(range(N))


def test_invalid_batch_layout_is_rejected():
    with pytest.raises(ValueError, match="multiple of dp_size=3"):
        GlobalOrderSampler(N, global_batch_size=8, dp_rank=0, dp_size=3, seed=0)
    with pytest.raises(ValueError, match="not a multiple of micro_batch_size=3"):
        GlobalOrderSampler(N, global_batch_size=8, dp_rank=0, dp_size=2, seed=0, micro_batch_size=3)


def loader_steps(loaders, num_micro=None) -> list[list[list[int]]]:
    return [[list(b) for b in itertools.islice(iter(ld), num_micro)] for ld in loaders]


def make_loaders(dp_size: int, micro: int, workers: int):
    return [
        build_dataloader(
            IndexDataset(),
            global_batch_size=GBS,
            micro_batch_size=micro,
            dp_rank=r,
            dp_size=dp_size,
            seed=SEED,
            num_workers=workers,
            collate_fn=list,
        )
        for r in range(dp_size)
    ]


@pytest.mark.slow
def test_loader_state_ignores_worker_read_ahead_and_resumes_at_another_dp_size():
    uninterrupted = global_steps(loader_steps(make_loaders(2, 2, 0)), 2)
    first = make_loaders(2, 2, workers=2)
    done = loader_steps(first, 2 * 2)  # 2 optimizer steps; workers have prefetched more
    assert global_steps(done, 2) == uninterrupted[:2]
    state = first[1].state_dict()
    assert state["consumed_samples"] == 2 * GBS and first[1].sampler.position() > 4
    resumed = make_loaders(4, 1, workers=1)
    for ld in resumed:
        ld.load_state_dict(state)
    assert global_steps(loader_steps(resumed), 2) == uninterrupted[2:]


@pytest.mark.slow
def test_sampler_works_with_torchdata_stateful_dataloader():
    tdl = pytest.importorskip("torchdata.stateful_dataloader")

    def loader():
        s = GlobalOrderSampler(
            N, global_batch_size=GBS, dp_rank=0, dp_size=2, seed=SEED, micro_batch_size=2, buckets=BUCKETS
        )
        return tdl.StatefulDataLoader(IndexDataset(), batch_sampler=s, num_workers=2, collate_fn=list)

    full = [list(b) for b in loader()]
    first = loader()
    it = iter(first)
    head = [list(next(it)) for _ in range(5)]
    state = first.state_dict()
    second = loader()
    second.load_state_dict(state)
    assert head + [list(b) for b in second] == full


@pytest.mark.parametrize(("dp_size", "micro"), [(1, GBS), (2, 2)])
def test_one_epoch_yields_each_step_once_then_stops(dp_size: int, micro: int):
    s = samplers(dp_size, micro)[0]
    steps = len(s.global_batches(0))
    yielded = list(
        itertools.islice(iter(s), 10 * steps * s.accumulation_steps)
    )  # bounded: a repeat never ends
    assert len(yielded) == steps * s.accumulation_steps == len(s)
    assert [b for step in s.global_batches(0) for b in s.rank_micro_batches(step)] == yielded
    assert s.epoch == 1
