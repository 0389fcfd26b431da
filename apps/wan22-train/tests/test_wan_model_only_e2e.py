"""Model-only checkpoints (training.model_save_interval) export and sample like full ones.

Tiny Wan T2V with an EMA, one forked gloo rank: the run ends at iteration 2 with both a full
checkpoint and a model-only one of the same state, so their exports and sampling weights must agree."""

from __future__ import annotations

import pytest
import torch
from diffusers import WanTransformer3DModel
from wan22_train.cli import main as wan22_main
from wan22_train.configs import config_path
from wan22_train.tiny import make_tiny, tiny_overrides

pytestmark = pytest.mark.slow


def test_a_model_only_checkpoint_exports_and_samples_as_the_full_one(tmp_path, main_forked):
    tiny = make_tiny(tmp_path / "tiny")
    overrides = [
        *tiny_overrides(tiny),
        f"training.save={tmp_path / 'ckpt'}",
        "training.train_iters=2",
        "training.save_interval=2",
        "training.model_save_interval=2",
        "training.ema.decay=0.5",
        "parallel.ulysses_parallel_size=1",
    ]
    main_forked(wan22_main, ["--config", str(config_path("tiny_t2v.yaml")), *overrides], nproc=1)
    full, model_only = tmp_path / "ckpt", tmp_path / "ckpt" / "model_only"
    assert sorted(p.name for p in model_only.glob("iter_*")) == ["iter_0000002"]

    from mm_trainer import load_run_config
    from wan22_train.export import export_predictor
    from wan22_train.sampling import load_for_sampling

    for ema in (False, True):
        exported = [
            WanTransformer3DModel.from_pretrained(
                export_predictor(load_run_config(root), root, tmp_path / f"out-{i}-{ema}", ema=ema)
            ).state_dict()
            for i, root in enumerate((full, model_only))
        ]
        assert exported[0].keys() == exported[1].keys()
        for key, value in exported[0].items():
            assert torch.equal(value, exported[1][key]), key

    sampled = [
        load_for_sampling(load_run_config(root), root)["predictor"].state_dict()
        for root in (full, model_only)
    ]
    for key, value in sampled[0].items():
        assert torch.equal(value, sampled[1][key]), key
