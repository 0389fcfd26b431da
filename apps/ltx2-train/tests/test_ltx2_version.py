"""The LTX-2 release (2.0, 2.3, 2.5) read from the checkpoint: diffusers folders written by
``save_pretrained`` with each release's options, official single files' metadata, and the build's refusals."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from ltx2_train.predictor import LTX2Predictor
from ltx2_train.tiny import TINY_TRANSFORMER, tiny_transformer
from ltx2_train.version import checkpoint_version, config_version, folder_version, single_file_version
from safetensors.torch import save_file

#: Each release's transformer options (diffusers' arguments), on the tiny shape.
RELEASES = {
    "2.0": {},
    "2.3": dict(gated_attn=True, cross_attn_mod=True, audio_gated_attn=True, audio_cross_attn_mod=True,
                use_prompt_embeddings=False, perturbed_attn=True),
    "2.5": dict(gated_attn=True, cross_attn_mod=True, audio_gated_attn=True, audio_cross_attn_mod=True,
                use_prompt_embeddings=False, perturbed_attn=True, ff_bias=False, use_prompt_adaln_single=False,
                use_keyframes_abs_pos_embedding=True),
}  # fmt: skip


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, object]:
    """A ``save_pretrained`` transformer folder per release."""
    root = tmp_path_factory.mktemp("releases")
    out = {}
    for version, options in RELEASES.items():
        out[version] = root / version
        tiny_transformer(**options).save_pretrained(out[version])
    return out


@pytest.mark.parametrize("version", sorted(RELEASES))
def test_a_diffusers_folder_is_recognised_from_its_config(folders, version):
    assert folder_version(folders[version]) == version
    assert checkpoint_version(folders[version]) == version


def test_an_unknown_combination_is_refused_naming_the_file_and_the_fields(tmp_path):
    tiny_transformer(gated_attn=True).save_pretrained(tmp_path)  # 2.3's gates on 2.0's other options
    with pytest.raises(ValueError) as info:
        folder_version(tmp_path)
    message = str(info.value)
    assert str(tmp_path / "config.json") in message and "no known LTX-2 release" in message
    assert "gated_attn=true, cross_attn_mod=false, use_prompt_embeddings=true" in message
    assert "2.3: gated_attn=true, cross_attn_mod=true" in message


def test_a_missing_key_means_the_arguments_default():
    assert config_version({}, "x") == "2.0"
    assert (
        config_version({"gated_attn": True, "cross_attn_mod": True, "use_prompt_embeddings": False}, "x")
        == "2.3"
    )


def official_file(path, transformer: dict | None, **metadata: str):
    """A single ``.safetensors`` with the official layout of metadata: ``config`` JSON with a ``transformer``
    section (the original option names) and the given top-level keys."""
    if transformer is not None:
        metadata["config"] = json.dumps({"transformer": transformer})
    save_file({"model.diffusion_model.proj_out.bias": torch.zeros(2)}, str(path), metadata=metadata)
    return path


@pytest.mark.parametrize(
    ("transformer", "stated", "version"),
    [
        ({}, "2.0.0", "2.0"),
        ({"apply_gated_attention": True, "cross_attention_adaln": True, "caption_proj_before_connector": True},
         "2.3", "2.3"),
        ({"apply_gated_attention": True, "cross_attention_adaln": True, "caption_proj_before_connector": True,
          "ff_bias": False, "use_prompt_adaln_single": False}, "2.5.0", "2.5"),
    ],
)  # fmt: skip
def test_an_official_single_file_is_recognised_from_its_metadata(tmp_path, transformer, stated, version):
    path = official_file(tmp_path / "ltx.safetensors", transformer, model_version=stated)
    assert single_file_version(path) == version
    assert checkpoint_version(path) == version


def test_a_single_file_whose_model_version_contradicts_its_options_is_refused(tmp_path):
    path = official_file(tmp_path / "ltx.safetensors", {"ff_bias": True}, model_version="2.5")
    with pytest.raises(
        ValueError, match=r"ltx.safetensors: its metadata says model_version '2.5' but .* LTX-2.0's"
    ):
        single_file_version(path)


def test_a_single_file_without_the_config_metadata_is_refused(tmp_path):
    path = official_file(tmp_path / "other.safetensors", None, format="pt")
    with pytest.raises(
        ValueError, match=r"other.safetensors: no 'config' metadata .* metadata keys: \['format'\]"
    ):
        single_file_version(path)


@pytest.mark.parametrize("version", sorted(RELEASES))
def test_the_build_recognises_the_release_and_logs_it(folders, version, caplog):
    model = LTX2Predictor.build_from_config(
        SimpleNamespace(from_pretrained=str(folders[version]), config=None)
    )
    assert model.ltx2_version == version
    assert f"LTX-2 transformer: LTX-{version} (read from {folders[version] / 'config.json'})" in caplog.text


def test_the_build_refuses_a_config_that_contradicts_the_checkpoint(folders):
    args = SimpleNamespace(from_pretrained=str(folders["2.3"]), config={"gated_attn": False, "num_layers": 1})
    with pytest.raises(ValueError, match=r"model.config: gated_attn=false \(the checkpoint's: true\) contradicts "
                                         r".*2.3/config.json, an LTX-2.3 transformer"):  # fmt: skip
        LTX2Predictor.build_from_config(args)


def test_the_build_of_a_shape_without_a_checkpoint_refuses_an_unknown_release():
    args = SimpleNamespace(from_pretrained=None, config=TINY_TRANSFORMER | {"ff_bias": False})
    with pytest.raises(ValueError, match="model.config: the LTX-2 transformer options .*ff_bias=false"):
        LTX2Predictor.build_from_config(args)


@pytest.mark.parametrize("version", ["2.3", "2.5"])
def test_the_pipeline_refuses_a_release_whose_forward_it_does_not_feed_yet(folders, version):
    from ltx2_train.pipeline import LTX2Pipeline

    model = LTX2Predictor.build_from_config(
        SimpleNamespace(from_pretrained=str(folders[version]), config=None)
    )
    batch = {"latents": torch.randn(1, 8, 2, 4, 4), "prompt_embeds": torch.randn(1, 6, 32),
             "prompt_attention_mask": torch.ones(1, 6, dtype=torch.long)}  # fmt: skip
    with pytest.raises(ValueError, match=f"the transformer is LTX-{version} .* trains LTX-2.0 only"):
        LTX2Pipeline(audio=False).prepare_conditions(SimpleNamespace(model=model), batch)
