"""Plugins register through `training.plugin` module names and the `mm_trainer.plugins` entry points."""

import pytest
from mm_trainer import DATA_REGISTRY, MODEL_REGISTRY, import_plugins
from mm_trainer.plugins import PluginImportError


def test_installed_apps_register_through_their_entry_points():
    imported = import_plugins([])
    assert {"wan22_train.plugin", "ltx2_train.plugin"} <= set(imported)
    for model_id in ("wan2_2_predictor", "wan2_2_container", "umt5", "wan_video_vae", "ltx2_predictor"):
        assert model_id in MODEL_REGISTRY
    assert "ltx2_precomputed" in DATA_REGISTRY


def test_a_plugin_module_that_does_not_import_is_named():
    with pytest.raises(
        PluginImportError, match="training.plugin: cannot import plugin module 'no_such_plugin'"
    ):
        import_plugins(["no_such_plugin"], entry_point_group=None)
