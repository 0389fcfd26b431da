"""The LTX-2 release (2.0, 2.3, 2.5) read from the checkpoint: diffusers folders written by
``save_pretrained`` with each release's options, official single files' metadata, and the build's refusals."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from ltx2_train.predictor import LTX2Predictor
from ltx2_train.tiny import RELEASE_OPTIONS, TINY_TRANSFORMER, make_tiny, tiny_transformer
from ltx2_train.version import checkpoint_version, config_version, folder_version, single_file_version
from safetensors.torch import save_file


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, object]:
    """A ``save_pretrained`` transformer folder per release."""
    root = tmp_path_factory.mktemp("releases")
    out = {}
    for version, options in RELEASE_OPTIONS.items():
        out[version] = root / version
        tiny_transformer(**options).save_pretrained(out[version])
    return out


@pytest.mark.parametrize("version", sorted(RELEASE_OPTIONS))
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


@pytest.mark.parametrize("version", sorted(RELEASE_OPTIONS))
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


def test_make_tiny_refuses_a_release_it_does_not_know(tmp_path):
    with pytest.raises(ValueError, match=r"make-tiny --release 2.4: expected one of \['2.0', '2.3', '2.5'\]"):
        make_tiny(tmp_path, release="2.4")
    assert not any(tmp_path.iterdir())  # refused before anything is written


def test_make_tiny_refuses_a_folder_holding_another_releases_transformer(folders, tmp_path):
    import shutil

    shutil.copytree(folders["2.3"], tmp_path / "transformer")
    with pytest.raises(ValueError, match="an LTX-2.3 transformer is already there, not 2.0"):
        make_tiny(tmp_path)
