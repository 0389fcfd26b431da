"""``mm-config check`` refuses every registered name it does not know (model, container and dataset ids,
templates, multimodal plugins, attention implementations), each as one error with the closest known name;
plain ``load_config`` leaves names to the registries. Runs without torch (``model_checks=False``)."""

from __future__ import annotations

import json

import pytest
from mm_config import (
    ConfigError,
    check_config,
    declare_ids,
    known_ids,
    register_id_provider,
    undeclare_ids,
)
from mm_config.known_ids import _PROVIDERS


@pytest.fixture
def toy_ids():
    """The toy container's ids, declared as its plugin's schema module would."""
    ids = {"container": ["toy_container"], "model": ["toy_vae", "toy_te", "toy_dit"]}
    for kind, names in ids.items():
        declare_ids(kind, *names)
    yield
    for kind, names in ids.items():
        undeclare_ids(kind, *names)


def check_error(write_config, data: dict, check_paths: bool = False) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        check_config(write_config(data), check_paths=check_paths, model_checks=False)
    return info.value


def test_each_misspelt_id_of_a_container_config_is_one_error_with_the_closest_name(
    write_config, container, toy_ids
):
    data = container(data={"dataset_id": "video_txt", "data_path": "m.json"})
    data["model"]["container_id"] = "toy_containr"
    data["model"]["models"]["ae"]["model_id"] = "toy_vea"  # a sub-model without a config section
    err = check_error(write_config, data)
    assert sorted(err.paths) == ["data.dataset_id", "model.container_id", "model.models.ae.model_id"], str(
        err
    )
    assert "model.models.ae.model_id = 'toy_vea': unknown model id; did you mean `toy_vae`?" in str(err)
    assert "model.container_id = 'toy_containr': unknown container id; did you mean `toy_container`?" in str(
        err
    )
    assert "data.dataset_id = 'video_txt': unknown dataset id; did you mean `video_text`?" in str(err)


def test_conversation_template_plugin_and_attention_names_are_checked(write_config, tmp_path):
    processor = tmp_path / "model"
    processor.mkdir()
    data = {
        "model": {"model_id": "hf_causal_lm", "config": {"attn_implementation": "flash_attention2"}},
        "data": {"dataset_id": "conversation", "data_path": "rows.json",
                 "dataset": {"processor": str(processor), "template": "chatmlx", "mm_plugin": "txt"}},
    }  # fmt: skip
    err = check_error(write_config, data)
    assert sorted(err.paths) == [
        "data.dataset.mm_plugin", "data.dataset.template", "model.config.attn_implementation",
    ], str(err)  # fmt: skip
    assert "did you mean `flash_attention_2`?" in str(err) and "did you mean `chatml`?" in str(err)
    assert "unknown multimodal plugin; did you mean `text`?" in str(err)


def test_the_tokenizer_template_and_a_hub_kernel_need_no_registration(write_config, tmp_path):
    data = {
        "model": {
            "model_id": "hf_causal_lm",
            "config": {"attn_implementation": "kernels-community/flash-attn"},
        },
        "data": {
            "dataset_id": "conversation",
            "data_path": "rows.json",
            "dataset": {"processor": str(tmp_path)},
        },
    }
    assert check_config(write_config(data), check_paths=False, model_checks=False).config


def test_a_missing_processor_folder_is_a_path_error(write_config, tmp_path):
    data = {"data": {"dataset_id": "conversation", "data_path": str(tmp_path / "rows.json"),
                     "dataset": {"processor": str(tmp_path / "nowhere")}}}  # fmt: skip
    (tmp_path / "rows.json").write_text("[]")
    err = check_error(write_config, data, check_paths=True)
    assert err.paths == ["data.dataset.processor"] and "path not found" in str(err)


def test_an_unregistered_model_id_over_a_transformers_folder_is_an_error_naming_the_generic_id(
    write_config, tmp_path
):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl"}))
    declare_ids("model", "qwen2_5_vl")  # as qwen-vl-train's schema module does
    try:
        data = {"model": {"model_id": "qwen25_vl", "from_pretrained": str(tmp_path)}}
        err = check_error(write_config, data)
    finally:
        undeclare_ids("model", "qwen2_5_vl")
    assert err.paths == ["model.model_id"], str(err)
    assert "unknown model id; did you mean `qwen2_5_vl`?" in str(err)
    assert "set model_id: hf_causal_lm" in str(err)


def test_the_generic_transformers_class_is_asked_for_by_its_id(write_config, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    data = {"model": {"model_id": "hf_causal_lm", "from_pretrained": str(tmp_path)}}
    assert check_config(write_config(data), model_checks=False).config.model.model_id == "hf_causal_lm"


def test_names_are_left_to_the_registries_by_load_config_and_without_plugins(load, write_config):
    data = {"model": {"model_id": "not_registered_anywhere"}, "data": {"dataset_id": "nor_this"}}
    assert load(data).model.model_id == "not_registered_anywhere"
    assert check_config(write_config(data), plugins=False, model_checks=False).config


def test_a_provider_makes_names_known(write_config):
    provider = lambda kind: ["provided_model"] if kind == "model" else []  # noqa: E731
    register_id_provider(provider)
    try:
        assert "provided_model" in known_ids("model")
        assert check_config(
            write_config({"model": {"model_id": "provided_model"}}), model_checks=False
        ).config
    finally:
        _PROVIDERS.remove(provider)
