"""mm-trainer's model checks (the ``mm_config.checks`` entry point of ``mm-config check`` and the trainer's
preflight): ``hf_config`` keys against the transformers config class, freeze groups against the model
class, plan patterns segment by segment against the model built on meta; and the registered names the
check knows, tied to the registries, transformers and mm-data."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest
from mm_config import (
    ATTN_IMPLEMENTATIONS,
    BUILTIN_MM_PLUGINS,
    BUILTIN_TEMPLATES,
    ConfigError,
    check_config,
    declared_ids,
    load_schema_entry_points,
)

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    """A tiny ``Qwen2ForCausalLM`` folder whose weights file is junk: a check that read it would fail."""
    config = transformers.Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)  # fmt: skip
    out = tmp_path_factory.mktemp("qwen2")
    transformers.Qwen2ForCausalLM(config).save_pretrained(out)
    for weights in out.glob("*.safetensors"):
        weights.write_bytes(b"not a safetensors file")
    return out


@pytest.fixture
def write_config(tmp_path):
    """``write_config(data) -> Path`` of a YAML file."""
    import yaml

    def write(data: dict):
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(data))
        return path

    return write


def check_error(write_config, data) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        check_config(write_config(data))
    return info.value


def lm(folder, **config) -> dict:
    return {
        "model": {
            "model_id": "hf_causal_lm",
            "from_pretrained": str(folder),
            "meta_init": True,
            "config": config,
        }
    }


def test_mm_trainer_installs_its_model_checks_for_mm_config_check():
    (check,) = [ep for ep in entry_points(group="mm_config.checks") if ep.name == "model"]
    assert check.value == "mm_trainer.checks.model_checks:model_checks"


def test_a_misspelt_hf_config_key_is_an_error_naming_the_config_field(write_config, tiny_lm):
    err = check_error(write_config, lm(tiny_lm, hf_config={"rms_norm_epss": 1e-5, "hidden_act": "gelu"}))
    assert err.paths == ["model.config.hf_config.rms_norm_epss"]
    assert "not a field of transformers' Qwen2Config; did you mean `rms_norm_eps`?" in str(err)


def test_freeze_groups_and_architecture_are_checked_against_the_model_class(write_config, tiny_lm):
    err = check_error(
        write_config, lm(tiny_lm, freeze_groups=["vision_tower"], architecture="Qwen2ForCausalLMM")
    )
    assert err.paths == ["model.config.architecture"]  # no class to judge the groups by
    assert "did you mean `Qwen2ForCausalLM`?" in str(err)
    err = check_error(write_config, lm(tiny_lm, freeze_groups=["vision_tower"]))
    assert err.paths == ["model.config.freeze_groups[0]"] and "no module group `vision_tower`" in str(err)


def test_a_plan_pattern_typo_past_its_first_segment_names_its_key_and_segment(write_config, tiny_lm):
    data = lm(tiny_lm)
    data["parallel"] = {
        "fsdp_plan": {"apply_modules": ["model.model.layers.{*}", "model.model.layers.{*}.self_atn"]}
    }
    data["features"] = {"recompute_plan": {"apply_modules": ["model.model.layer.{*}"]}}
    err = check_error(write_config, data)
    assert err.paths == ["parallel.fsdp_plan.apply_modules[1]", "features.recompute_plan.apply_modules[0]"]
    assert (
        "segment `self_atn` matches no module under `model.model.layers.{*}` (2 module(s), e.g. "
        "`model.model.layers.0`); did you mean `self_attn`?"
    ) in str(err)
    assert "segment `layer` matches no module under `model.model`" in str(err) and "`layers`?" in str(err)


def test_a_good_config_passes_without_reading_weights(write_config, tiny_lm):
    data = lm(tiny_lm, hf_config={"rms_norm_eps": 1e-5, "rope_parameters": {"rope_theta": 1e4}})
    data["parallel"] = {"fsdp_plan": {"apply_modules": ["model.model.layers.{*}"]}}
    assert check_config(write_config(data)).config.model.config["hf_config"]["rms_norm_eps"] == 1e-5


def test_the_trainer_refuses_a_pattern_typo_at_its_key_before_anything_starts(write_config, tiny_lm):
    import torch.distributed as dist
    from mm_config import load_config
    from mm_trainer import Trainer

    data = lm(tiny_lm)
    data["features"] = {"activation_offload_plan": {"apply_modules": ["model.model.layers.{*}.mpl"]}}
    config = load_config(write_config(data), world_size=1)  # a Python caller that skipped mm-config check
    with pytest.raises(
        ConfigError, match=r"features.activation_offload_plan.apply_modules\[0\] = .*did you mean `mlp`"
    ):
        Trainer(config)
    assert not dist.is_initialized()


# --- the names the check knows are the registries' -------------------------------------------------


def test_every_installed_plugins_registrations_are_declared_by_its_schema_module():
    """What ``mm-config check`` knows without importing a plugin's torch code covers what the installed
    packages register (other tests register probes of their own: left out by module)."""
    from mm_data import MM_PLUGINS
    from mm_trainer import DATA_REGISTRY, MODEL_REGISTRY, ModelContainer
    from mm_trainer.registry.plugins import load_entry_point_plugins

    load_schema_entry_points()
    load_entry_point_plugins()
    packages = {"mm_trainer", "mm_data", "wan22_train", "ltx2_train", "qwen_vl_train"}

    def installed(registered: dict) -> dict:
        return {n: obj for n, obj in registered.items() if obj.__module__.split(".")[0] in packages}

    models = installed(MODEL_REGISTRY.registered())
    containers = {n for n, c in models.items() if isinstance(c, type) and issubclass(c, ModelContainer)}
    assert containers and containers <= set(declared_ids("container"))
    assert set(models) - containers <= set(declared_ids("model"))
    assert set(installed(DATA_REGISTRY.registered())) <= set(declared_ids("dataset"))
    plugins = {n for n in MM_PLUGINS if MM_PLUGINS.get(n).__module__.split(".")[0] in packages}
    assert plugins == {"text", "qwen2_vl"} and plugins <= set(declared_ids("mm_plugin"))


def test_mm_configs_builtin_names_are_mm_datas_and_transformers():
    """With the test above (every registration declared), the names mm-config declares are exactly these."""
    from mm_data import MM_PLUGINS, TEMPLATES
    from transformers import AttentionInterface

    assert set(ATTN_IMPLEMENTATIONS) == {"eager", *AttentionInterface._global_mapping}
    assert set(BUILTIN_TEMPLATES) <= set(TEMPLATES) and set(BUILTIN_MM_PLUGINS) <= set(MM_PLUGINS)


def test_mm_config_check_no_model_checks_skips_them(write_config, tiny_lm, capsys):
    from mm_config.cli import main

    path = write_config(lm(tiny_lm, hf_config={"rms_norm_epss": 1e-5}))
    assert main(["check", str(path)]) == 2 and "rms_norm_epss" in capsys.readouterr().err
    assert main(["check", str(path), "--no-model-checks"]) == 0
