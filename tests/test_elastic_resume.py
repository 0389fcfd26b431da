"""Elastic resume on the toy plugin: a dp 1 -> dp 2 -> dp 4 chain trains what one uninterrupted run trains,
and ends with the EMA (``training.ema``) that run ends with."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from mm_checkpoint.dcp_io import DcpReader

pytestmark = pytest.mark.slow

SECTIONS = {
    # one global batch of 8 at every world size: accumulation 4, 2, 1 is derived per layout
    "training": {
        "global_batch_size": 8,
        "micro_batch_size": 2,
        "gradient_accumulation_steps": None,
        "train_iters": 6,
        "save_interval": 2,
        "log_sample_ids": True,
        "ema": {"decay": 0.8},
    },
    "data": {"dataset": {"num_samples": 24}},  # 3 steps an epoch: the chain crosses an epoch
}


def test_a_dp_1_2_4_chain_trains_each_sample_once_with_the_uninterrupted_losses_and_ema(
    toy_yaml, mm_train_forked
):
    reference = toy_yaml("reference", **SECTIONS)
    expected, expected_dir = mm_train_forked(reference), reference.parent / "ckpt"

    previous, records = None, []
    for name, world, until in (("dp1", 1, 2), ("dp2", 2, 4), ("dp4", 4, 6)):
        config = toy_yaml(name, **SECTIONS)
        load = [f"training.load={previous}"] if previous else []
        records += mm_train_forked(config, *load, f"training.train_iters={until}", nproc=world)
        previous = config.parent / "ckpt"

    assert [r["step"] for r in records] == list(range(1, 7))
    trained = [r["sample_ids"] for r in records]
    assert trained == [r["sample_ids"] for r in expected]
    assert sorted(i for ids in trained for i in ids) == list(range(6 * 8))  # no repeats, none skipped
    torch.testing.assert_close(
        torch.tensor([r["loss"] for r in records]),
        torch.tensor([r["loss"] for r in expected]),
        rtol=1e-4,
        atol=0,
    )
    # The EMA was saved at dp 1 and 2, restored and resharded at dp 2 and 4: the uninterrupted run's.
    chained, uninterrupted = _averages(previous), _averages(expected_dir)
    assert chained.keys() == uninterrupted.keys() and "predictor.head.weight" in chained
    for key, value in uninterrupted.items():
        torch.testing.assert_close(chained[key], value, rtol=1e-5, atol=1e-7)


def _averages(ckpt: Path) -> dict[str, torch.Tensor]:
    """The EMA of the trained (predictor) parameters in the last checkpoint under ``ckpt``."""
    reader = DcpReader(ckpt / "iter_0000006", ema=True)
    return {k: reader.read(k) for k in reader.keys() if k.startswith("predictor.")}
