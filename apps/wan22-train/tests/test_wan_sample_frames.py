"""An image (a one-frame sample) in a data set whose Wan task cannot train one frame (``ti2v``: its loss
leaves out the clean first latent frame) is refused before any weight is read, naming the sample; t2v and
ti2v runs over clips alone pass the check."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mm_config import load_config
from mm_data import make_synthetic_dataset
from mm_trainer import check_samples
from mm_trainer.run.exit_codes import EXIT_INPUT
from wan22_train.configs import config_path
from wan22_train.tiny import make_tiny, tiny_overrides

TINY = config_path("tiny_t2v.yaml")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return make_tiny(tmp_path_factory.mktemp("tiny"))


def clips_and_an_image(out: Path, num_images: int) -> Path:
    """4 clips of 9 frames at 32 x 32, then ``num_images`` PNGs (dataset indices 4, 5, ...)."""
    return make_synthetic_dataset(
        out, num_clips=4, sizes=[(32, 32)], num_frames=(9,), fps=(8,), num_images=num_images, seed=0
    )


@pytest.mark.slow
def test_an_image_in_a_ti2v_run_is_refused_naming_it_before_any_weight_is_read(tiny, tmp_path):
    """Through ``python -m wan22_train``: exit 66 (input), the sample's index, file and why, no traceback;
    the transformer's weights file is garbage, so reaching any weight read would end otherwise."""
    bad = tmp_path / "tiny"
    shutil.copytree(tiny, bad)
    (bad / "transformer" / "diffusion_pytorch_model.safetensors").write_bytes(b"not a safetensors file")
    data = clips_and_an_image(tmp_path / "data", num_images=1)
    args = ["--config", str(TINY), *tiny_overrides(bad), f"data.data_path={data}", "model.pipeline.task=ti2v",
            f"training.save={tmp_path / 'run'}", "training.train_iters=1", "parallel.ulysses_parallel_size=1",
            "training.global_batch_size=4"]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "wan22_train", *args],
        env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == EXIT_INPUT, proc.stderr[-3000:]
    image = tmp_path / "data" / "image_0000.png"
    assert f"sample 4 ({image}): 1 frame(s) make 1 latent frame; model.pipeline.task=ti2v" in proc.stderr, (
        proc.stderr[-3000:]
    )
    assert "Traceback" not in proc.stderr and "not a valid safetensors file" not in proc.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.parametrize(("task", "num_images"), [("ti2v", 0), ("t2v", 1), ("i2v", 1)])
def test_runs_whose_pipeline_takes_every_sample_pass_the_check(tiny, tmp_path, task, num_images):
    """ti2v over clips alone; t2v and i2v with an image (they run one-frame samples)."""
    data = clips_and_an_image(tmp_path / "data", num_images=num_images)
    overrides = [*tiny_overrides(tiny), f"data.data_path={data}", f"model.pipeline.task={task}",
                 "parallel.ulysses_parallel_size=1"]  # fmt: skip
    check_samples(load_config(TINY, overrides, world_size=1))
