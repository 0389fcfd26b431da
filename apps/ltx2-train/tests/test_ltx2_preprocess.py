"""`ltx2-train preprocess`: tiny clips -> cached files -> the precomputed dataset equals a direct encode; a
training run is checked against how the cache was made."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow


def test_precomputed_dataset_yields_the_tensors_of_a_direct_encode(tiny_cache, run_config):
    from ltx2_train.preprocess import LTX2Encoders, encode_sample, preprocess_options, source_dataset
    from mm_config import load_config
    from mm_data import sha256_file
    from mm_trainer.registry.registries import DATA_REGISTRY

    config = load_config(run_config(tiny_cache), ["parallel.ulysses_parallel_size=1"], world_size=1)
    options = preprocess_options(config)
    dataset = DATA_REGISTRY.get("ltx2_precomputed")(data_path=config.data.data_path)
    clips = source_dataset(options)
    encoders = LTX2Encoders.load(
        options.model_root, audio=True, device=torch.device("cpu"), dtype=torch.float32
    )
    assert len(dataset) == len(clips) == 4
    for index in (0, 3):
        cached = dataset[index]
        item = {**clips.sample(index), "clip_sha256": sha256_file(clips.rows[index]["path"])}
        direct = encode_sample(
            encoders, item, frame_rate=8.0, max_length=16, missing_audio=options.missing_audio
        )
        assert cached["prompt"] == clips[index]["prompt"] == direct["metadata"]["prompt"]
        tensors = {k: v for k, v in direct.items() if isinstance(v, torch.Tensor)}
        assert set(tensors) <= set(cached)
        for key, value in tensors.items():
            torch.testing.assert_close(cached[key], value, rtol=0, atol=0, msg=key)
    sample = dataset[0]
    assert sample["latents"].shape == (8, 3, 4, 4)  # 5 frames 16x16 -> x2 time, x4 space
    # 0.625 s: 10000 // 160 + 1 = 63 mel frames, causal /4
    assert sample["audio_latents"].shape == (4, 16, 4)
    assert sample["prompt_embeds"].shape == sample["audio_prompt_embeds"].shape == (16, 32)
    assert not torch.equal(sample["prompt_embeds"], sample["audio_prompt_embeds"])  # two connectors


def test_a_second_preprocess_run_reuses_every_sample(tiny_cache, run_config):
    from ltx2_train.preprocess import run_preprocess
    from mm_config import load_config

    config = load_config(run_config(tiny_cache), ["parallel.ulysses_parallel_size=1"], world_size=1)
    report = run_preprocess(config)
    assert report.computed == [] and report.reused == list(range(4))


def test_a_run_is_refused_when_its_section_differs_from_the_cache_or_the_source_changed_since(
    tiny_cache, run_config
):
    from mm_config import load_config
    from mm_data import CacheMismatchError
    from mm_trainer import check_cache_made_as_configured

    config = run_config(tiny_cache)
    same = load_config(config, ["parallel.ulysses_parallel_size=1"], world_size=1)
    check_cache_made_as_configured(same.data)  # made as this run says
    other = load_config(config, ["parallel.ulysses_parallel_size=1", "data.dataset.preprocess.height=32",
                                 "data.dataset.preprocess.dtype=bf16"], world_size=1)  # fmt: skip
    with pytest.raises(CacheMismatchError) as error:
        check_cache_made_as_configured(other.data)
    assert "data.dataset.preprocess.height: the cache was made with 16, this run says 32" in str(error.value)
    assert 'data.dataset.preprocess.dtype: the cache was made with "fp32", this run says "bf16"' in str(
        error.value
    )

    metadata = tiny_cache / "data" / "metadata.json"
    original = metadata.read_bytes()
    try:
        metadata.write_bytes(original + b"\n")  # the same rows, other bytes: refused all the same
        with pytest.raises(
            CacheMismatchError, match=f"the source metadata {metadata} changed since the cache was made"
        ):
            check_cache_made_as_configured(same.data)
    finally:
        metadata.write_bytes(original)
    check_cache_made_as_configured(same.data)


def test_a_caption_folder_source_caches_the_tensors_of_the_metadata_file_of_the_same_clips(
    tiny_cache, run_config, tmp_path
):
    """The tiny clips in a folder, each with the caption the metadata source draws for it as ``.txt``: the
    cache written from the folder holds the metadata source's tensors, sample by sample (the frame rate
    from the clips' headers, as the metadata rows state it)."""
    from ltx2_train.preprocess import preprocess_options, run_preprocess, source_dataset
    from mm_config import load_config
    from mm_trainer.registry.registries import DATA_REGISTRY

    config = load_config(run_config(tiny_cache), ["parallel.ulysses_parallel_size=1"], world_size=1)
    clips = source_dataset(preprocess_options(config))
    folder = tmp_path / "captioned"
    folder.mkdir()
    for index, row in enumerate(clips.rows):
        clip = folder / Path(row["path"]).name
        shutil.copy(row["path"], clip)
        clip.with_suffix(".txt").write_text(clips.sample(index)["prompt"])
    overrides = ["parallel.ulysses_parallel_size=1", f"data.data_path={tmp_path / 'cache'}",
                 f"data.dataset.preprocess.source={folder}"]  # fmt: skip
    report = run_preprocess(load_config(run_config(tiny_cache), overrides, world_size=1))
    assert report.computed == [0, 1, 2, 3]
    cached = DATA_REGISTRY.get("ltx2_precomputed")
    from_folder = cached(data_path=str(tmp_path / "cache"))
    from_file = cached(data_path=config.data.data_path)
    for index in range(4):
        a, b = from_folder[index], from_file[index]
        assert a["prompt"] == b["prompt"]
        for key, value in b.items():
            if isinstance(value, torch.Tensor):
                torch.testing.assert_close(a[key], value, rtol=0, atol=0, msg=key)


def test_a_clip_without_audio_gets_what_missing_audio_says_and_a_stand_in_tone_follows_its_content():
    from ltx2_train.audio import synthetic_tone
    from ltx2_train.preprocess import MissingAudioError, clip_waveform, content_tone

    wave = clip_waveform(None, sample_rate=16000, seconds=0.5, missing="tone", tone=3)
    torch.testing.assert_close(wave, synthetic_tone(3, 16000, 8000))
    assert not torch.equal(wave, synthetic_tone(4, 16000, 8000))
    assert content_tone({"index": 5, "clip_sha256": "0000000a" + "f" * 56}) == 10  # the clip, not its row
    assert content_tone({"index": 5}) == 5
    assert torch.equal(
        clip_waveform(None, sample_rate=16000, seconds=0.5, missing="silence"), torch.zeros(2, 8000)
    )
    with pytest.raises(MissingAudioError, match="no audio track"):
        clip_waveform(None, sample_rate=16000, seconds=0.5)


def test_make_tiny_reports_a_vae_that_reconstructs_the_clips_and_reuses_its_fit(tiny_cache, capsys, readme):
    import json

    from diffusers import AutoencoderKLLTX2Video
    from ltx2_train.cli import main
    from ltx2_train.tiny import VAE_FIT_STEPS, load_clips
    from mm_data import psnr
    from mm_trainer import reconstruct

    report = json.loads((tiny_cache / "vae" / "fit.json").read_text())
    assert report["fit_steps"] == VAE_FIT_STEPS and report["samples"] == 4
    assert report["psnr_db"] >= 25.0
    vae = AutoencoderKLLTX2Video.from_pretrained(tiny_cache / "vae").eval()
    clips = load_clips(tiny_cache / "data" / "metadata.json")
    assert psnr(reconstruct(vae, clips).clamp(-1, 1), clips) == pytest.approx(report["psnr_db"], abs=0.01)
    assert not torch.equal(vae.latents_std, torch.ones_like(vae.latents_std))  # the clips' statistics

    weights = tiny_cache / "vae" / "diffusion_pytorch_model.safetensors"
    written = weights.stat().st_mtime_ns
    make_tiny = readme.command("apps/ltx2-train/README.md", "ltx2-train make-tiny runs/ltx2_tiny",
                               paths={"runs/ltx2_tiny": tiny_cache})  # fmt: skip
    assert main(make_tiny[1:]) == 0  # the README's command; the same seed, steps and clips: the fit is reused
    assert weights.stat().st_mtime_ns == written
    printed = capsys.readouterr().out
    assert f"tiny VAE reconstruction PSNR on the 4 clips: {report['psnr_db']:.2f} dB" in printed
