"""A model set's parts checked against each other from their configs: the text side's release (text encoder
family, connectors' projections) against the transformer's, and the video VAE's compression (read from its
config) against the transformer's ``vae_scale_factors`` and the clip size. Mismatches are refused before any
work: by ``preprocess`` before any encoder loads, and by a training run before anything is built
(``mm_trainer.check_model_set``). Model sets here are configs only (no weights): the refusals read nothing else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ltx2_train.text_side import model_set_problems, read_text_side
from ltx2_train.tiny import (
    RELEASE_OPTIONS,
    TEXT_ENCODERS,
    TINY_TRANSFORMER,
    tiny_connectors,
    tiny_release_connectors,
    tiny_vae,
)
from ltx2_train.vae_factors import video_vae_factors
from mm_config import load_config
from mm_trainer import ModelSetError, check_model_set
from mm_trainer.run.exit_codes import EXIT_INPUT
from mm_trainer.run.user_errors import user_error_class

EXPECTED = {
    "2.0": "expected LTX-2.0's, Gemma-3 with connectors of one projection",
    "2.3": "expected LTX-2.3's, Gemma-3 with connectors of per-modality projections",
    "2.5": "expected LTX-2.5's, Gemma-4 with connectors of per-modality projections",
}


def write_model_set(
    root: Path, transformer: str, text: str, hidden_size: int | None = None, vae_patch: int | None = None
) -> Path:
    """The configs of a tiny model set: an LTX-``transformer`` transformer, LTX-``text``'s text side, and with
    ``vae_patch`` the tiny video VAE's config with that ``patch_size`` (x2 more space per 2)."""
    (root / "transformer").mkdir(parents=True)
    config = TINY_TRANSFORMER | RELEASE_OPTIONS[transformer]
    (root / "transformer" / "config.json").write_text(json.dumps(config))
    encoder = TEXT_ENCODERS[text][1](40).config
    if hidden_size is not None:
        encoder.hidden_size = hidden_size
    encoder.save_pretrained(root / "text_encoder")
    connectors = tiny_connectors() if text == "2.0" else tiny_release_connectors(32, 16)
    connectors.save_config(root / "connectors")
    if vae_patch is not None:
        (root / "vae").mkdir()
        (root / "vae" / "config.json").write_text(
            json.dumps(dict(tiny_vae().config) | {"patch_size": vae_patch})
        )
    return root


@pytest.mark.parametrize("release", sorted(RELEASE_OPTIONS))
def test_each_releases_text_side_is_recognised_from_its_configs_and_fits_its_transformer(tmp_path, release):
    root = write_model_set(tmp_path, release, release)
    side = read_text_side(root)
    assert side.release == release
    assert model_set_problems(side, release, root / "transformer" / "config.json") == []


@pytest.mark.parametrize(("transformer", "text"), [("2.5", "2.3"), ("2.3", "2.5"), ("2.0", "2.5")])
def test_preprocess_refuses_a_transformer_with_another_releases_text_side_before_any_encoder_loads(
    run_config, tmp_path, transformer, text
):
    from ltx2_train.preprocess import run_preprocess
    from mm_data import make_synthetic_dataset

    root = write_model_set(tmp_path, transformer, text)
    meta = make_synthetic_dataset(tmp_path / "data", num_clips=1, sizes=[(16, 16)], num_frames=(5,), fps=(8,))
    config = load_config(run_config(root), ["parallel.ulysses_parallel_size=1",
                                            f"data.dataset.preprocess.source={meta}"], world_size=1)  # fmt: skip
    with pytest.raises(ModelSetError) as refused:
        run_preprocess(config)
    message = str(refused.value)
    assert f"{root / 'transformer' / 'config.json'}: an LTX-{transformer} transformer" in message
    assert f"the text side is LTX-{text}'s" in message
    assert (
        str(root / "text_encoder" / "config.json") in message
        and str(root / "connectors" / "config.json") in message
    )
    assert EXPECTED[transformer] in message
    assert user_error_class(refused.value).exit_code == EXIT_INPUT  # exit 66
    assert not (root / "latents").exists()  # nothing was encoded


def test_a_training_run_refuses_a_25_transformer_with_a_gemma3_text_side_before_anything_is_built(
    run_config, tmp_path
):
    """What the trainer asks before it builds a model (``check_model_set``): the transformer is
    ``model.from_pretrained``, the text side the one ``data.dataset.preprocess.model_root`` cached."""
    root = write_model_set(tmp_path, "2.5", "2.0")
    config = load_config(run_config(root), ["parallel.ulysses_parallel_size=1"], world_size=1)
    with pytest.raises(
        ModelSetError, match=r"an LTX-2\.5 transformer, but the text side is LTX-2\.0's"
    ) as refused:
        check_model_set(config)
    assert EXPECTED["2.5"] in str(refused.value)
    assert user_error_class(refused.value).exit_code == EXIT_INPUT


def test_connectors_of_another_text_encoder_are_refused_naming_both_files(tmp_path):
    root = write_model_set(tmp_path, "2.5", "2.5", hidden_size=48)
    (problem,) = model_set_problems(read_text_side(root), "2.5", "x")
    assert f"{root / 'connectors' / 'config.json'}: caption_channels 32 x text_proj_in_factor 3" in problem
    assert f"the text encoder {root / 'text_encoder' / 'config.json'} gives 3 hidden states of 48" in problem


def test_the_video_vaes_compression_is_read_from_its_config():
    """The tiny VAE compresses x2 in time and x(patch_size x 2) in space: 4 as made, 8 with patch 4."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        assert video_vae_factors(write_model_set(Path(tmp) / "a", "2.0", "2.0", vae_patch=2)) == (2, 4)
        assert video_vae_factors(write_model_set(Path(tmp) / "b", "2.0", "2.0", vae_patch=4)) == (2, 8)


def test_a_vae_of_other_factors_than_the_transformers_and_a_clip_it_cannot_compress_are_refused(
    run_config, tmp_path
):
    """A VAE compressing space x8 under a transformer whose RoPE grid says x4, and clips 20 high (not a
    multiple of 8): both named by ``preprocess`` before any encoder loads, and the first by a training run."""
    from ltx2_train.preprocess import run_preprocess
    from mm_data import make_synthetic_dataset

    root = write_model_set(tmp_path, "2.0", "2.0", vae_patch=4)
    meta = make_synthetic_dataset(tmp_path / "data", num_clips=1, sizes=[(20, 16)], num_frames=(5,), fps=(8,))
    overrides = ["parallel.ulysses_parallel_size=1", f"data.dataset.preprocess.source={meta}",
                 "data.dataset.preprocess.height=20"]  # fmt: skip
    config = load_config(run_config(root), overrides, world_size=1)
    vae = root / "vae" / "config.json"
    mismatch = (
        f"{root / 'transformer' / 'config.json'}: vae_scale_factors [2, 4, 4], but the video VAE ({vae}) "
        "compresses [2, 8, 8]"
    )
    with pytest.raises(ModelSetError) as refused:
        run_preprocess(config)
    assert mismatch in str(refused.value)
    assert (
        f"data.dataset.preprocess: 5 frames of 20 x 16: the video VAE ({vae}) compresses time x2 and space x8, "
        "so it takes 1 + k x 2 frames (2k+1) and heights and widths that are multiples of 8"
    ) in str(refused.value)
    assert not (root / "latents").exists()
    with pytest.raises(ModelSetError) as at_training:
        check_model_set(config)
    assert mismatch in str(at_training.value)
