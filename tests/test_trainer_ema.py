"""``training.ema`` on the toy plugin at world size 2: the average a checkpoint holds is the formula
over the weights of every step (each rank updating its own FSDP2 shards)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from mm_checkpoint.dcp_io import DcpReader
from safetensors.torch import load_file

pytestmark = pytest.mark.slow

DECAY = 0.8


def _predictor(iteration_dir: Path, *, ema: bool = False) -> dict[str, torch.Tensor]:
    reader = DcpReader(iteration_dir, ema=ema)
    prefix = "predictor."
    return {k[len(prefix) :]: reader.read(k) for k in reader.keys() if k.startswith(prefix)}


def test_the_saved_ema_after_n_steps_is_the_decay_formula_over_each_steps_weights(
    toy_yaml, toy_predictor_dir, mm_train_forked
):
    config = toy_yaml("ema", training={"train_iters": 3, "save_interval": 1, "ema": {"decay": DECAY}})
    mm_train_forked(config, nproc=2)
    ckpt = config.parent / "ckpt"

    expected = {k: v.double() for k, v in load_file(toy_predictor_dir / "model.safetensors").items()}
    for iteration in (1, 2, 3):
        weights = _predictor(ckpt / f"iter_{iteration:07d}")
        assert weights.keys() == expected.keys()
        expected = {k: DECAY * e + (1 - DECAY) * weights[k].double() for k, e in expected.items()}
    averages = _predictor(ckpt / "iter_0000003", ema=True)
    assert averages.keys() == expected.keys()
    for key, value in expected.items():
        torch.testing.assert_close(averages[key].double(), value, rtol=1e-6, atol=1e-7)
    assert not torch.equal(averages["head.weight"], weights["head.weight"])
