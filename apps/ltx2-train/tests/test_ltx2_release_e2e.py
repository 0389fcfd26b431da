"""An LTX-2.3 transformer trains end to end: ``make-tiny --release 2.3`` (its transformer and per-modality
connectors; the tests' fitted VAE, clips and Gemma-3 reused), ``preprocess``, 2 steps of ``ltx2-train`` on
one process (finite losses; the 2.3-only weights, prompt modulation and attention gates, move) and a
sample from the run."""

from __future__ import annotations

import json
import math
import shutil
from types import SimpleNamespace

import pytest
import torch
from ltx2_train.tiny import CLIP

pytestmark = pytest.mark.slow

#: The model-set parts that do not depend on the release (the release writes transformer/ and connectors/).
SHARED_PARTS = ("data", "vae", "audio_vae", "text_encoder", "tokenizer")
README = "apps/ltx2-train/README.md"
MAKE_TINY_23 = "ltx2-train make-tiny runs/ltx2_tiny_23 --release 2.3"


@pytest.fixture(scope="module")
def run_23(tiny_cache, tmp_path_factory, run_config, ltx2_train, readme) -> SimpleNamespace:
    """The README's tiny 2.3 set, its cache and a 2-step run (one rank, no recompute) saved at its last step."""
    from ltx2_train.cli import main
    from ltx2_train.preprocess import run_preprocess
    from mm_config import load_config

    root = tmp_path_factory.mktemp("ltx2_tiny_23")
    for part in SHARED_PARTS:  # the tests' model set: its fitted VAE (fit.json) and clips are reused
        shutil.copytree(tiny_cache / part, root / part)
    assert main(readme.command(README, MAKE_TINY_23, paths={"runs/ltx2_tiny_23": root})[1:]) == 0
    assert run_preprocess(
        load_config(run_config(root), ["parallel.ulysses_parallel_size=1"], world_size=1)
    ).computed
    save = root / "ckpt"
    config = run_config(root, train_iters=2, save=str(save), save_interval=2)
    ltx2_train(
        "--config",
        str(config),
        "parallel.ulysses_parallel_size=1",
        "features.recompute_plan.apply_modules=[]",
    )
    rows = [json.loads(line) for line in (save / "metrics.jsonl").read_text().splitlines()]
    return SimpleNamespace(root=root, save=save, rows=[r for r in rows if "loss" in r])


def test_a_23_transformer_trains_with_finite_losses_of_both_modalities(run_23):
    assert [r["step"] for r in run_23.rows] == [1, 2]
    for row in run_23.rows:
        assert all(math.isfinite(row[k]) for k in ("loss", "loss_video", "loss_audio")), row


def test_the_23_prompt_modulation_and_attention_gates_train(run_23):
    from diffusers import LTX2VideoTransformer3DModel
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    flat = run_23.save / "flat.pt"
    dcp_to_torch_save(run_23.save / "iter_0000002", flat)
    trained = {k.removeprefix("model."): v for k, v in torch.load(flat, weights_only=False)["model"].items()}
    initial = LTX2VideoTransformer3DModel.from_pretrained(run_23.root / "transformer")
    assert initial.config.cross_attn_mod and not initial.config.use_prompt_embeddings  # a 2.3 transformer
    new = ("prompt_adaln.", "audio_prompt_adaln.", "prompt_scale_shift_table", "to_gate_logits")
    moved = {
        n
        for n, p in initial.named_parameters()
        if any(k in n for k in new) and not torch.equal(trained[n], p)
    }
    for key in new:
        assert any(key in n for n in moved), f"no {key} weight moved"


def test_a_23_run_samples_a_finite_clip_and_audio(run_23):
    from ltx2_train.sampling import load_for_sampling, sample_clip
    from mm_trainer import load_run_config

    modules = load_for_sampling(load_run_config(run_23.save), run_23.save)
    size = {k: CLIP[k] for k in ("num_frames", "height", "width")}
    video, mel = sample_clip(
        modules, "a red circle moving up", **size, frame_rate=CLIP["fps"], steps=2, seed=0
    )
    assert (
        video.shape == (3, CLIP["num_frames"], CLIP["height"], CLIP["width"]) and torch.isfinite(video).all()
    )
    assert mel is not None and torch.isfinite(mel).all()
