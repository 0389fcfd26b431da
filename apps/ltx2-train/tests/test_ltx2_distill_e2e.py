"""LTX-2 few-step distillation through the trainer (``configs/tiny_t2av_distill.yaml``: a teacher, the
student ``model`` and a critic, video and audio): a run at 2 ranks with Ulysses 2, resumed from its
checkpoint at 1 rank without Ulysses, trains every phase's losses of the uninterrupted run; the student
exports as a plain LTX-2 transformer and ``ltx2-train sample --steps 4`` draws it on its own schedule, the
clip (and audio) that ``training.validation`` sampled after the last step at 2 ranks with Ulysses 2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from mm_data import decode_frames

pytestmark = pytest.mark.slow

STEPS, SAVE_EVERY = 6, 3
PHASE_LOSSES = ("loss_critic", "loss_generator")
GENERATOR_EVERY = "training.phases.generator.every=2"  # the student updates at steps 1, 3 and 5 (1-based)
LTX2_README = "apps/ltx2-train/README.md"
EXPORT = "ltx2-train export --checkpoint runs/ltx2_tiny/ckpt_distill --out runs/ltx2_tiny/export_distill/transformer"
SAMPLE = 'ltx2-train sample --checkpoint runs/ltx2_tiny/ckpt_distill --steps 4 --prompt "a red circle moving up" --out runs/ltx2_tiny/sample_distill.mp4'


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def phase_losses(rows: list[dict], key: str) -> torch.Tensor:
    return torch.tensor([r.get(key, float("nan")) for r in rows])


@pytest.fixture(scope="module")
def distilled(tiny_cache, run_config, distill_config, ltx2_train) -> SimpleNamespace:
    """The uninterrupted distillation: 6 steps on 2 ranks (Ulysses 2), checkpoints at 3 and 6."""
    save = tiny_cache / "distill"
    validation = {
        "interval": STEPS,
        "prompts": ["a red circle moving up"],
        "num_frames": 5,
        "height": 16,
        "width": 16,
        "fps": 8,
    }  # fmt: skip  (the student samples on its own 4-step schedule)
    config = run_config(
        tiny_cache, distill_config, train_iters=STEPS, save_interval=SAVE_EVERY, deterministic=True, save=str(save),
        validation=validation,
    )  # fmt: skip
    ltx2_train("--config", str(config), GENERATOR_EVERY, nproc=2)
    return SimpleNamespace(config=config, save=save, rows=records(save))


def test_a_distillation_resumed_at_another_layout_trains_the_losses_of_the_uninterrupted_run(
    distilled, ltx2_train, tiny_cache
):
    rows = distilled.rows
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert [r["step"] for r in rows if "loss_generator" in r] == [1, 3, 5]
    assert all("loss_critic" in r for r in rows)

    resume_from = tiny_cache / "distill_resume_from"
    shutil.copytree(distilled.save / "iter_0000003", resume_from / "iter_0000003")
    (resume_from / "latest_checkpointed_iteration.txt").write_text("3")
    resumed_dir = tiny_cache / "distill_resumed_world_1"
    ltx2_train(
        "--config", str(distilled.config), GENERATOR_EVERY, f"training.load={resume_from}",
        f"training.save={resumed_dir}", "parallel.ulysses_parallel_size=1",
    )  # fmt: skip
    resumed = records(resumed_dir)
    assert [r["step"] for r in resumed] == [4, 5, 6]
    for key in PHASE_LOSSES:
        torch.testing.assert_close(
            phase_losses(resumed, key), phase_losses(rows[3:], key), rtol=1e-4, atol=0, equal_nan=True
        )


def test_the_student_exports_as_a_plain_transformer_and_samples_on_its_schedule(
    distilled, ltx2_train, tiny_cache, readme
):
    from diffusers import LTX2VideoTransformer3DModel
    from ltx2_train import sampling
    from mm_trainer import load_run_config
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    flat = tiny_cache / "distill_flat.pt"
    dcp_to_torch_save(distilled.save / f"iter_{STEPS:07d}", flat)
    state = torch.load(flat, weights_only=True)["model"]
    assert {k.split(".")[0] for k in state} == {"model", "critic"}  # the teacher reloads from its source

    runs = {"runs/ltx2_tiny/ckpt_distill": distilled.save, "runs/ltx2_tiny": tiny_cache}
    out = tiny_cache / "export_distill" / "transformer"
    ltx2_train(*readme.command(LTX2_README, EXPORT, paths=runs)[1:])
    exported = LTX2VideoTransformer3DModel.from_pretrained(out).state_dict()
    teacher = LTX2VideoTransformer3DModel.from_pretrained(tiny_cache / "transformer").state_dict()
    key = "proj_out.weight"
    torch.testing.assert_close(exported[key], state[f"model.{key}"], rtol=0, atol=0)
    assert not torch.equal(exported[key], teacher[key]) and not torch.equal(
        exported[key], state[f"critic.{key}"]
    )

    # `sample --steps 4` writes the clip and its audio; it runs the student on the 4 sigmas it trained on
    clip = tiny_cache / "sample_distill.mp4"
    ltx2_train(*readme.command(LTX2_README, SAMPLE, paths=runs)[1:])
    assert clip.is_file() and clip.with_suffix(".wav").is_file()
    validated = distilled.save / "validation" / f"iter_{STEPS:07d}" / "0.mp4"  # the same prompt, seed 0, size
    sampled, during_training = (
        decode_frames(p, list(range(5)), 16, 16).astype(int) for p in (clip, validated)
    )
    assert abs(sampled - during_training).max() <= 1 and validated.with_suffix(".wav").is_file()
    modules = sampling.load_for_sampling(load_run_config(distilled.save), distilled.save)
    timesteps: list[tuple[float, float]] = []
    modules["holder"].model.register_forward_hook(
        lambda _, __, kwargs, ___: timesteps.append(
            (kwargs["timestep"].item(), kwargs["audio_timestep"].item())
        ),
        with_kwargs=True,
    )
    sampling.sample_clip(
        modules, "a red circle moving up", num_frames=5, height=16, width=16, frame_rate=8, steps=4
    )
    trained = (modules["distillation"].student_sigmas()[:-1] * 1000).tolist()
    assert [video for video, _ in timesteps] == pytest.approx(trained)
    assert [audio for _, audio in timesteps] == pytest.approx(trained)
