"""`expert: both`: both A14B experts train in one job at data-parallel 2; one checkpoint holds both."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint import FileSystemReader, load
from wan22_train.configs import config_path
from wan22_train.key_maps import diffusers_to_native
from wan22_train.tiny import make_tiny, tiny_overrides

pytestmark = pytest.mark.slow


def test_both_experts_train_and_share_one_checkpoint(tmp_path):
    tiny = make_tiny(tmp_path / "tiny")
    overrides = [
        *tiny_overrides(tiny),
        f"model.models.predictor_low.from_pretrained={tiny / 'transformer'}",
        f"training.save={tmp_path / 'ckpt'}",
        "training.train_iters=16",
        "training.micro_batch_size=1",
        "parallel.ulysses_parallel_size=1",  # data parallel 2: ranks must still pick the same expert
    ]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "-m", "wan22_train", "--config", str(config_path("tiny_t2v_both.yaml")), *overrides]  # fmt: skip
    proc = subprocess.run(
        cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-5000:]

    start = diffusers_to_native(load_file(tiny / "transformer" / "diffusion_pytorch_model.safetensors"))
    ckpt = tmp_path / "ckpt" / "iter_0000016"
    keys = FileSystemReader(str(ckpt)).read_metadata().state_dict_metadata
    for expert in ("predictor", "predictor_low"):
        weight = f"model.{expert}.blocks.0.self_attn.q.weight"
        assert weight in keys
        state = {weight: torch.empty(start["blocks.0.self_attn.q.weight"].shape)}
        load(state, checkpoint_id=str(ckpt))
        assert not torch.equal(state[weight], start["blocks.0.self_attn.q.weight"]), f"{expert} never trained"
    assert not any("text_encoder" in k or k.startswith("model.ae.") for k in keys)
