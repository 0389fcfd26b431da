"""A distillation with ``training.ema`` exports the student's average (``export --ema``): the trainer
updates the average after every step of the phased loop, the generator phase only every 5th step, so
after 5 steps with one generator update ``w1`` from the teacher's weights ``w0`` the average is
``w1 + decay**5 * (w0 - w1)``."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from diffusers import WanTransformer3DModel
from mm_trainer import load_run_config
from wan22_train.configs import config_path
from wan22_train.export import export_predictor
from wan22_train.key_maps import diffusers_to_native
from wan22_train.tiny import make_tiny, tiny_overrides

pytestmark = pytest.mark.slow

DECAY, STEPS = 0.5, 5


def native_weights(folder) -> dict[str, torch.Tensor]:
    return diffusers_to_native(WanTransformer3DModel.from_pretrained(folder).state_dict())


def test_a_distillation_exports_the_ema_of_its_student(tmp_path):
    tiny, save = make_tiny(tmp_path / "tiny"), tmp_path / "run"
    teacher = [f"model.models.{name}.from_pretrained={tiny / 'transformer'}" for name in ("teacher", "critic")]
    run = subprocess.run(
        [sys.executable, "-m", "wan22_train", "--config", str(config_path("tiny_t2v_distill.yaml")),
         *tiny_overrides(tiny), *teacher, f"training.save={save}", f"training.train_iters={STEPS}",
         f"training.save_interval={STEPS}", "training.tensorboard=false", "parallel.ulysses_parallel_size=1",
         f"training.ema={{decay: {DECAY}}}"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    config = load_run_config(save)
    last = native_weights(export_predictor(config, save, tmp_path / "last"))
    average = native_weights(export_predictor(config, save, tmp_path / "ema", ema=True))
    start = native_weights(tiny / "transformer")
    moved = [key for key in last if not torch.equal(last[key], start[key])]
    assert moved, "the generator step changed no weight of the student"
    step = torch.cat([(start[key] - last[key]).double().flatten() for key in last])
    lead = torch.cat([(average[key] - last[key]).double().flatten() for key in last])
    # the average's lead over the last weights, as a multiple of the generator's step: decay**5, elementwise
    assert (lead @ step / (step @ step)).item() == pytest.approx(DECAY**STEPS, rel=1e-3)
    torch.testing.assert_close(lead, DECAY**STEPS * step, rtol=0, atol=1e-3 * step.abs().max().item())
