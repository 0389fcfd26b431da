"""Where each sub-model finds its files in a release folder as downloaded (official or ``-Diffusers``),
and what an official config.json leaves to the official class's defaults."""

from __future__ import annotations

import json

import pytest
from wan22_train.model import WanDiTConfig
from wan22_train.release import WAN22_LATENTS_MEAN, WAN22_LATENTS_STD, component_path, vae_keywords


def _official(root):
    for folder in ("high_noise_model", "low_noise_model", "google/umt5-xxl"):
        (root / folder).mkdir(parents=True)
    for name in ("Wan2.1_VAE.pth", "models_t5_umt5-xxl-enc-bf16.pth"):
        (root / name).write_bytes(b"")
    return root


def _diffusers(root):
    for folder in ("vae", "text_encoder", "tokenizer", "transformer", "transformer_2"):
        (root / folder).mkdir(parents=True)
    (root / "model_index.json").write_text("{}")
    return root


@pytest.mark.parametrize(
    ("component", "official", "diffusers"),
    [("vae", "Wan2.1_VAE.pth", "vae"), ("text_encoder", "models_t5_umt5-xxl-enc-bf16.pth", "text_encoder"),
     ("tokenizer", "google/umt5-xxl", "tokenizer"), ("high_noise", "high_noise_model", "transformer"),
     ("low_noise", "low_noise_model", "transformer_2")],
)  # fmt: skip
def test_each_component_is_found_in_an_official_and_a_diffusers_root(
    tmp_path, component, official, diffusers
):
    assert component_path(_official(tmp_path / "a"), component) == tmp_path / "a" / official
    assert component_path(_diffusers(tmp_path / "b"), component) == tmp_path / "b" / diffusers


def test_a_source_that_names_its_own_files_is_used_as_it_is(tmp_path):
    root = _official(tmp_path / "root")
    assert component_path(root / "high_noise_model", "high_noise") == root / "high_noise_model"
    assert component_path(root / "Wan2.1_VAE.pth", "vae") == root / "Wan2.1_VAE.pth"
    assert component_path(None, "vae") is None


def test_a_one_dit_release_is_its_own_dit_and_two_experts_need_the_predictors_expert(tmp_path):
    ti2v = tmp_path / "Wan2.2-TI2V-5B"
    ti2v.mkdir()
    (ti2v / "config.json").write_text("{}")
    (ti2v / "Wan2.2_VAE.pth").write_bytes(b"")
    assert component_path(ti2v, "dit") == ti2v
    with pytest.raises(FileNotFoundError, match=r"two A14B experts.*config\.expert"):
        component_path(_official(tmp_path / "a14b"), "dit")


def test_a_root_without_the_component_or_with_two_candidates_is_refused_naming_them(tmp_path):
    root = _official(tmp_path / "root")
    (root / "Wan2.2_VAE.pth").write_bytes(b"")
    with pytest.raises(
        FileNotFoundError, match=r"several candidates for the VAE.*Wan2\.1_VAE\.pth.*Wan2\.2_VAE\.pth"
    ):
        component_path(root, "vae")
    (root / "models_t5_umt5-xxl-enc-bf16.pth").unlink()
    with pytest.raises(FileNotFoundError, match=r"without the UMT5 encoder"):
        component_path(root, "text_encoder")


def test_an_official_config_json_takes_the_official_defaults_for_what_it_omits(tmp_path):
    release = {"_class_name": "WanModel", "_diffusers_version": "0.33.0", "dim": 5120, "eps": 1e-06, "ffn_dim": 13824,
               "freq_dim": 256, "in_dim": 16, "model_type": "t2v", "num_heads": 40, "num_layers": 40, "out_dim": 16,
               "text_len": 512}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(release))
    config = WanDiTConfig.from_file(tmp_path / "config.json")
    assert config == WanDiTConfig.t2v_a14b()  # text_dim 4096, qk_norm, cross_attn_norm, patch (1, 2, 2)
    written = config.to_native()
    assert {k: v for k, v in written.items() if k != "_diffusers_version"} == {
        k: v for k, v in release.items() if k != "_diffusers_version"
    }
    assert config.official_mismatches() == []


def test_a_48_channel_vae_without_statistics_takes_the_wan2_2_release_ones():
    keywords = vae_keywords({"z_dim": 48, "is_residual": True})
    assert keywords["latents_mean"] == WAN22_LATENTS_MEAN and keywords["latents_std"] == WAN22_LATENTS_STD
    assert "latents_mean" not in vae_keywords({"z_dim": 16})  # diffusers' defaults are Wan2.1's already


def test_vae_statistics_of_another_length_than_z_dim_are_refused():
    with pytest.raises(ValueError, match=r"latents_std has 16 values; z_dim is 48"):
        vae_keywords({"z_dim": 48, "latents_std": [1.0] * 16})
