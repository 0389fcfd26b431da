"""A clip without an audio track in an LTX-2 source with audio (``data.dataset.preprocess.missing_audio``):
refused before any encoder loads, naming it (exit 66), or encoded as silence, named in the report."""

from __future__ import annotations

import json

import pytest
import torch
from mm_config import load_config

pytestmark = pytest.mark.slow

TONE_HZ = 700.0


@pytest.fixture(scope="module")
def mixed_source(tmp_path_factory):
    """Tiny clips (5 frames, 16 x 16, 8 fps): row 0 with a 700 Hz audio track, row 1 without one, row 2 a
    truncated file (no header to read: the cache writer reports it as failed, whatever ``missing_audio``)."""
    from mm_data import make_synthetic_dataset

    root = tmp_path_factory.mktemp("ltx2_missing_audio")
    size = dict(num_clips=1, sizes=[(16, 16)], num_frames=(5,), fps=(8,))
    rows = []
    for name, tones, corrupt in (("sound", (TONE_HZ,), 0), ("silent", None, 1)):
        meta = make_synthetic_dataset(root / name, **size, tones=tones, corrupt=corrupt)
        rows += [{**row, "path": str(meta.parent / row["path"])} for row in json.loads(meta.read_text())]
    source = root / "metadata.json"
    source.write_text(json.dumps(rows))
    return source


def overrides(source, cache, missing_audio):
    return ["parallel.ulysses_parallel_size=1", f"data.dataset.preprocess.source={source}", f"data.data_path={cache}",
            f"data.dataset.preprocess.missing_audio={missing_audio}"]  # fmt: skip


def test_a_clip_without_audio_is_refused_before_any_encoder_loads_naming_it(
    tiny_cache, run_config, mixed_source, tmp_path
):
    from ltx2_train.preprocess import MissingAudioError, run_preprocess
    from mm_trainer.run.user_errors import user_error_class

    nowhere = tmp_path / "no_model_set"  # the encoders would fail to load: the refusal comes first
    config = load_config(run_config(tiny_cache), [*overrides(mixed_source, tmp_path / "cache", "refuse"),
                                                  f"data.dataset.preprocess.model_root={nowhere}"], world_size=1)  # fmt: skip
    with pytest.raises(MissingAudioError) as error:
        run_preprocess(config)
    message = str(error.value)
    assert "1 clip(s) without an audio track" in message and "missing_audio: silence" in message
    assert f"sample 1 ({mixed_source.parent / 'silent' / 'clip_0000.mp4'})" in message
    assert "sample 0" not in message and "sample 2" not in message
    assert user_error_class(error.value).exit_code == 66
    assert not (tmp_path / "cache").exists()


def test_silence_encodes_a_clip_without_audio_as_zeros_beside_the_real_track_of_the_other(
    tiny_cache, run_config, mixed_source, tmp_path
):
    from ltx2_train.audio import read_audio
    from ltx2_train.preprocess import LTX2Encoders, run_preprocess
    from mm_trainer.registry.registries import DATA_REGISTRY

    config = load_config(
        run_config(tiny_cache), overrides(mixed_source, tmp_path / "cache", "silence"), world_size=1
    )
    report = run_preprocess(config)
    assert report.computed == [0, 1] and [bad.index for bad in report.failed] == [2]
    silent = str(mixed_source.parent / "silent" / "clip_0000.mp4")
    assert "1 clip(s) without an audio track, encoded with silence (zeros) (missing_audio: silence)" in str(
        report
    )
    assert f"[1] {silent}" in str(report) and "sound" not in str(report)
    cached = DATA_REGISTRY.get("ltx2_precomputed")(data_path=str(tmp_path / "cache"))
    encoders = LTX2Encoders.load(tiny_cache, audio=True, device=torch.device("cpu"), dtype=torch.float32)
    samples = 10000  # 5 frames at 8 fps, 16 kHz
    silence = encoders.encode_audio(torch.zeros(2, samples))
    torch.testing.assert_close(cached[1]["audio_latents"], silence, rtol=0, atol=0)
    track = read_audio(mixed_source.parent / "sound" / "clip_0000.mp4", 16000, samples)
    assert track is not None and track.abs().max() > 0.4  # the 700 Hz sine at 0.5 written by PyAV
    torch.testing.assert_close(cached[0]["audio_latents"], encoders.encode_audio(track), rtol=0, atol=0)
    assert not torch.equal(cached[0]["audio_latents"], silence)
