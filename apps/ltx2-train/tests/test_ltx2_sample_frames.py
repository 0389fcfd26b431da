"""A cached sample with no latent frame left to generate after the conditioning ones (an image: 1 latent
frame; here the tiny clips' 3 with ``conditioning_frames=3``) is refused before training, naming each
sample, instead of at the first step (``mm_trainer.check_samples``, ``LTX2Container.sample_frame_problems``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mm_config import load_config
from mm_trainer import check_samples
from mm_trainer.run.exit_codes import EXIT_INPUT

pytestmark = pytest.mark.slow

EXTENSION = Path(__file__).resolve().parents[1] / "configs" / "tiny_t2av_extension.yaml"


def test_samples_with_no_frame_after_the_conditioning_ones_are_refused_naming_them(
    tiny_cache, run_config, tmp_path
):
    config = run_config(tiny_cache, EXTENSION)
    args = ["--config", str(config), "model.pipeline.conditioning_frames=3", "parallel.ulysses_parallel_size=1",
            f"training.save={tmp_path / 'run'}", "training.train_iters=1"]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "ltx2_train", *args],
        env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == EXIT_INPUT, proc.stderr[-3000:]
    for i in range(4):
        assert (
            f"sample {i}: 3 latent frame(s) leave none to generate after model.pipeline.conditioning_frames=3"
            in (proc.stderr)
        ), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_the_extension_configs_two_conditioning_frames_of_three_pass_the_check(tiny_cache, run_config):
    config = load_config(
        run_config(tiny_cache, EXTENSION), ["parallel.ulysses_parallel_size=1"], world_size=1
    )
    check_samples(config)
