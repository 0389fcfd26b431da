"""LTX-2.3 and LTX-2.5 transformers train end to end: ``make-tiny --release R`` (its transformer, text encoder
(2.3: Gemma-3, 2.5: Gemma-4) and per-modality connectors; the tests' fitted VAE and clips reused),
``preprocess`` (its text embeddings: those of diffusers' ``LTX2Pipeline.encode_prompt`` + connectors), 2 steps
of ``ltx2-train`` on one process (finite losses; the release's own weights, prompt modulation and attention
gates, move) and a sample from the run."""

from __future__ import annotations

import json
import math
import shutil
from types import SimpleNamespace

import pytest
import torch
from ltx2_train.tiny import CLIP

pytestmark = pytest.mark.slow

#: The model-set parts that do not depend on the release (the release writes transformer/, text_encoder/ and
#: connectors/).
SHARED_PARTS = ("data", "vae", "audio_vae", "tokenizer")
README = "apps/ltx2-train/README.md"
#: The README's make-tiny line of each release.
MAKE_TINY = {
    "2.3": "ltx2-train make-tiny runs/ltx2_tiny_23 --release 2.3",
    "2.5": "ltx2-train make-tiny runs/ltx2_tiny_25 --release 2.5",
}
#: The weights only each release has (2.3: prompt modulation by sigma; 2.5: its fixed table) beside the gates.
RELEASE_WEIGHTS = {
    "2.3": ("prompt_adaln.", "audio_prompt_adaln.", "prompt_scale_shift_table", "to_gate_logits"),
    "2.5": ("prompt_scale_shift_table", "to_gate_logits"),
}


@pytest.fixture(scope="module", params=sorted(RELEASE_WEIGHTS))
def run_release(request, tiny_cache, tmp_path_factory, run_config, ltx2_train, readme) -> SimpleNamespace:
    """The README's tiny set of the release, its cache and a 2-step run (one rank, no recompute) saved at its
    last step."""
    from ltx2_train.cli import main
    from ltx2_train.preprocess import run_preprocess
    from mm_config import load_config

    release = request.param
    name = f"ltx2_tiny_{release.replace('.', '')}"
    root = tmp_path_factory.mktemp(name)
    for part in SHARED_PARTS:  # the tests' model set: its fitted VAE (fit.json) and clips are reused
        shutil.copytree(tiny_cache / part, root / part)
    assert main(readme.command(README, MAKE_TINY[release], paths={f"runs/{name}": root})[1:]) == 0
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
    return SimpleNamespace(release=release, root=root, save=save, config=config,
                           rows=[r for r in rows if "loss" in r])  # fmt: skip


def test_the_cache_holds_the_text_embeddings_of_diffusers_pipeline_for_the_release(run_release):
    """The cached caption embeddings are what diffusers' ``LTX2Pipeline`` feeds its transformer: its
    ``encode_prompt`` (every hidden state of the text encoder, stacked) through the release's connectors."""
    from diffusers import LTX2Pipeline
    from diffusers.pipelines.ltx2.connectors import LTX2TextConnectors
    from mm_trainer.registry.registries import DATA_REGISTRY
    from transformers import AutoModel, AutoTokenizer

    root = run_release.root
    encoder = AutoModel.from_pretrained(root / "text_encoder").eval()
    assert (
        type(encoder).__name__
        == {"2.3": "Gemma3TextModel", "2.5": "Gemma4UnifiedTextModel"}[run_release.release]
    )
    pipe = LTX2Pipeline(
        scheduler=None, vae=None, audio_vae=None, text_encoder=encoder, vocoder=None, transformer=None,
        tokenizer=AutoTokenizer.from_pretrained(root / "tokenizer"),
        connectors=LTX2TextConnectors.from_pretrained(root / "connectors").eval(),
    )  # fmt: skip
    dataset = DATA_REGISTRY.get("ltx2_precomputed")(data_path=str(root / "latents"))
    cached = dataset[0]
    with torch.no_grad():
        embeds, mask, _, _ = pipe.encode_prompt(cached["prompt"], do_classifier_free_guidance=False,
                                                max_sequence_length=16, device=torch.device("cpu"))  # fmt: skip
        video, audio, text_mask = pipe.connectors(embeds, mask, padding_side="left")
    torch.testing.assert_close(cached["prompt_embeds"], video[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(cached["audio_prompt_embeds"], audio[0], rtol=1e-5, atol=1e-6)
    assert torch.equal(cached["prompt_attention_mask"].bool(), text_mask[0].bool())


def test_the_transformer_trains_with_finite_losses_of_both_modalities(run_release):
    assert [r["step"] for r in run_release.rows] == [1, 2]
    for row in run_release.rows:
        assert all(math.isfinite(row[k]) for k in ("loss", "loss_video", "loss_audio")), row


def test_the_releases_own_weights_train(run_release):
    from diffusers import LTX2VideoTransformer3DModel
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    flat = run_release.save / "flat.pt"
    dcp_to_torch_save(run_release.save / "iter_0000002", flat)
    trained = {k.removeprefix("model."): v for k, v in torch.load(flat, weights_only=False)["model"].items()}
    initial = LTX2VideoTransformer3DModel.from_pretrained(run_release.root / "transformer")
    assert (
        initial.config.cross_attn_mod and not initial.config.use_prompt_embeddings
    )  # a 2.3 / 2.5 transformer
    new = RELEASE_WEIGHTS[run_release.release]
    moved = {
        n
        for n, p in initial.named_parameters()
        if any(k in n for k in new) and not torch.equal(trained[n], p)
    }
    for key in new:
        assert any(key in n for n in moved), f"no {key} weight moved"


def test_the_run_samples_a_finite_clip_and_audio(run_release):
    from ltx2_train.sampling import load_for_sampling, sample_clip
    from mm_trainer import load_run_config

    modules = load_for_sampling(load_run_config(run_release.save), run_release.save)
    size = {k: CLIP[k] for k in ("num_frames", "height", "width")}
    video, mel = sample_clip(
        modules, "a red circle moving up", **size, frame_rate=CLIP["fps"], steps=2, seed=0
    )
    assert (
        video.shape == (3, CLIP["num_frames"], CLIP["height"], CLIP["width"]) and torch.isfinite(video).all()
    )
    assert mel is not None and torch.isfinite(mel).all()
