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


def test_a_preprocess_source_with_images_and_audio_is_refused_naming_them_before_any_encoder_loads(
    run_config, tmp_path
):
    """LTX-2 trains a clip with its sound; a PNG beside the clips of a source with audio is named (index,
    file) with the reason and what to do (a video-only run takes it: tests/test_ltx2_images.py). No model set
    exists here: the refusal came before any encoder was loaded."""
    from ltx2_train.preprocess import run_preprocess
    from mm_data import make_synthetic_dataset
    from mm_trainer import SampleFramesError

    meta = make_synthetic_dataset(tmp_path / "media", num_clips=1, sizes=[(32, 32)], num_frames=(9,),
                                  fps=(8,), num_images=1)  # fmt: skip
    config = load_config(run_config(tmp_path), ["parallel.ulysses_parallel_size=1",
                                                f"data.dataset.preprocess.source={meta}"], world_size=1)  # fmt: skip
    with pytest.raises(SampleFramesError) as refused:
        run_preprocess(config)
    assert "1 image(s) in an LTX-2 source with audio (data.dataset.preprocess.audio: true)" in str(
        refused.value
    )
    assert (
        "an image has no sound: train images in a video-only run (data.dataset.preprocess.audio: false"
        in str(refused.value)
    )
    assert f"sample 1 ({meta.parent / 'image_0000.png'})" in str(refused.value)
    assert not (tmp_path / "latents").exists()


def test_packing_is_refused_for_ltx2_before_any_weight_is_read(tiny_cache, run_config):
    from mm_trainer import PackingError

    config = load_config(run_config(tiny_cache), ["parallel.ulysses_parallel_size=1",
                                                  "data.packing.token_budget=4096"], world_size=1)  # fmt: skip
    with pytest.raises(PackingError, match="LTX2Container does not train packed micro-batches"):
        check_samples(config)
