"""The README's LTX-2 training modes, each run 2 steps through ``ltx2-train``'s main on the tiny cache: a
frozen modality (the video trained with the audio branch frozen, and audio-only T2A) leaves the frozen
branch's weights as they were loaded and moves the other's; every run's ``metrics.jsonl`` has the loss of
each modality beside the total, which is the trained modalities' sum. The IC-LoRA lines run as a chain:
preprocess with the references, train, sample with a reference."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from ltx2_train.modality import branch_parameters

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]

README = "apps/ltx2-train/README.md"
TINY = "apps/ltx2-train/configs/tiny_t2av.yaml"
VIDEO_ONLY = "torchrun --standalone --nproc-per-node 2 -m ltx2_train --config apps/ltx2-train/configs/tiny_t2av.yaml model.pipeline.frozen_modality=audio training.save=runs/ltx2_tiny/ckpt_video_only"
AUDIO_ONLY = "torchrun --standalone --nproc-per-node 2 -m ltx2_train --config apps/ltx2-train/configs/tiny_t2av.yaml model.pipeline.frozen_modality=video training.save=runs/ltx2_tiny/ckpt_audio_only"
EXTENSION = "torchrun --standalone --nproc-per-node 2 -m ltx2_train --config apps/ltx2-train/configs/tiny_t2av_extension.yaml"
IC_LORA_CONFIG = "apps/ltx2-train/configs/tiny_t2av_ic_lora.yaml"
IC_LORA_PREPROCESS = "ltx2-train preprocess --config apps/ltx2-train/configs/tiny_t2av_ic_lora.yaml"
IC_LORA = "torchrun --standalone --nproc-per-node 2 -m ltx2_train --config apps/ltx2-train/configs/tiny_t2av_ic_lora.yaml"
IC_LORA_SAMPLE = 'ltx2-train sample --checkpoint runs/ltx2_tiny/ckpt_ic_lora --prompt "a red circle moving up" --reference runs/ltx2_tiny/data/references/clip_0000.mp4 --out runs/ltx2_tiny/sample_ic_lora.mp4'
INDEPENDENT = "torchrun --standalone --nproc-per-node 2 -m ltx2_train --config apps/ltx2-train/configs/tiny_t2av.yaml model.pipeline.audio_timesteps=independent training.save=runs/ltx2_tiny/ckpt_independent"


def run_readme_line(
    line: str, name: str, readme, ltx2_train, tiny_cache, run_config, config: str = TINY
) -> SimpleNamespace:
    """The README line on the tests' tiny cache (its ``config``'s paths moved there), shortened to 2 steps
    and saved under the cache: the checkpoint's weights and the metrics records."""
    save = tiny_cache / name
    moved = run_config(tiny_cache, REPO / config)
    argv = readme.command(README, line, paths={config: moved},
                          extra=("training.train_iters=2", f"training.save={save}"))  # fmt: skip
    _, nproc, args = readme.launched(argv)
    ltx2_train(*args, nproc=nproc)
    rows = [json.loads(line) for line in (save / "metrics.jsonl").read_text().splitlines()]
    return SimpleNamespace(
        rows=[r for r in rows if "loss" in r], weights=checkpoint_weights(save / "iter_0000002")
    )


def checkpoint_weights(ckpt: Path) -> dict[str, torch.Tensor]:
    """The transformer's weights in a DCP checkpoint, by upstream key."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    flat = ckpt.parent / "flat.pt"
    dcp_to_torch_save(ckpt, flat)
    return {k.removeprefix("model."): v for k, v in torch.load(flat, weights_only=False)["model"].items()}


def changed_by_branch(tiny_cache: Path, trained: dict[str, torch.Tensor]) -> dict[str, set[str]]:
    """``{"video": ..., "audio": ...}``: the parameters of each branch whose trained value differs from
    the model set's transformer (what the run loaded)."""
    from diffusers import LTX2VideoTransformer3DModel

    initial = LTX2VideoTransformer3DModel.from_pretrained(tiny_cache / "transformer")
    return {
        modality: {
            n for n, p in branch_parameters(initial, modality).items() if not torch.equal(trained[n], p)
        }
        for modality in ("video", "audio")
    }


@pytest.mark.parametrize(
    ("line", "frozen"), [(VIDEO_ONLY, "audio"), (AUDIO_ONLY, "video")], ids=["video only", "audio only (T2A)"]
)
def test_a_frozen_modality_run_leaves_that_branch_as_loaded_and_trains_the_other(
    line, frozen, readme, ltx2_train, tiny_cache, run_config
):
    run = run_readme_line(line, f"frozen_{frozen}", readme, ltx2_train, tiny_cache, run_config)
    changed = changed_by_branch(tiny_cache, run.weights)
    trained = "video" if frozen == "audio" else "audio"
    assert not changed[frozen], sorted(changed[frozen])
    assert changed[trained], "the trained branch did not move"
    assert [r["step"] for r in run.rows] == [1, 2]
    for row in run.rows:  # the loss is the trained modality's; the frozen one's is reported beside it
        assert row["loss_video"] > 0 and row["loss_audio"] > 0
        expected = row["loss_video"] if trained == "video" else row["loss_audio"]  # audio_loss_weight 1
        assert row["loss"] == pytest.approx(expected, rel=1e-5), row


def test_an_independent_timesteps_run_trains_both_and_logs_each_modalitys_loss(
    readme, ltx2_train, tiny_cache, run_config
):
    run = run_readme_line(INDEPENDENT, "independent", readme, ltx2_train, tiny_cache, run_config)
    changed = changed_by_branch(tiny_cache, run.weights)
    assert changed["video"] and changed["audio"]
    for row in run.rows:
        assert row["loss"] == pytest.approx(row["loss_video"] + row["loss_audio"], rel=1e-5), row


def test_a_video_extension_run_trains_on_the_frames_after_the_conditioning_ones(
    readme, ltx2_train, tiny_cache, run_config
):
    """The extension config (2 of 3 latent frames given clean) through the trainer at Ulysses 2: the
    per-token timesteps are split with the tokens; which tokens carry no loss is the pipeline's
    (test_ltx2_pipeline.py: test_video_extension_*)."""
    config = "apps/ltx2-train/configs/tiny_t2av_extension.yaml"
    run = run_readme_line(EXTENSION, "extension", readme, ltx2_train, tiny_cache, run_config, config)
    assert [r["step"] for r in run.rows] == [1, 2]
    for row in run.rows:
        assert row["loss"] == pytest.approx(row["loss_video"] + row["loss_audio"], rel=1e-5), row


def test_an_ic_lora_run_preprocesses_its_references_trains_with_them_and_samples_with_one(
    readme, ltx2_train, tiny_cache, run_config, tmp_path, capsys
):
    """The README's IC-LoRA chain on the tests' model set: preprocess caches each clip's reference (video and
    audio latents), 2 steps train the adapters with them in context, and ``sample --reference`` draws a clip
    (that another reference changes the prediction is checked at the pipeline: test_ltx2_conditioning.py)."""
    from ltx2_train.cli import main
    from mm_data import PrecomputedLatentDataset

    config = run_config(tiny_cache, REPO / IC_LORA_CONFIG)
    argv = readme.command(README, IC_LORA_PREPROCESS, paths={IC_LORA_CONFIG: config})
    assert main(argv[1:]) == 0
    cached = PrecomputedLatentDataset(tiny_cache / "latents_ic_lora")[0]
    assert cached["reference_latents"].shape == cached["latents"].shape
    assert cached["reference_audio_latents"].shape == cached["audio_latents"].shape
    assert not torch.equal(cached["reference_latents"], cached["latents"])  # the reversed motion
    run = run_readme_line(IC_LORA, "ckpt_ic_lora", readme, ltx2_train, tiny_cache, run_config, IC_LORA_CONFIG)
    assert [r["step"] for r in run.rows] == [1, 2]
    out = tmp_path / "sample.mp4"
    paths = {"runs/ltx2_tiny/ckpt_ic_lora": tiny_cache / "ckpt_ic_lora", "runs/ltx2_tiny/data": tiny_cache / "data",
             "runs/ltx2_tiny/sample_ic_lora.mp4": out}  # fmt: skip
    argv = readme.command(README, IC_LORA_SAMPLE, paths=paths, extra=("--steps", "1"))
    assert main(argv[1:]) == 0
    assert capsys.readouterr().out.split()[-2:] == [str(out), str(out.with_suffix(".wav"))]
