"""Plugins register through `training.plugin` module names and the `mm_trainer.plugins` entry points."""

import subprocess
import sys

import pytest
from mm_trainer import DATA_REGISTRY, MODEL_REGISTRY, import_plugins
from mm_trainer.registry.plugins import PluginImportError, load_entry_point_plugins


def test_installed_apps_register_through_their_entry_points():
    load_entry_point_plugins()
    for model_id in ("wan2_2_predictor", "wan2_2_container", "umt5", "wan_video_vae", "ltx2_predictor"):
        assert model_id in MODEL_REGISTRY
    assert "ltx2_precomputed" in DATA_REGISTRY


def test_entry_points_are_imported_only_when_a_lookup_misses():
    script = (
        "import sys; from mm_trainer import MODEL_REGISTRY\n"
        "assert 'wan22_train' not in sys.modules and 'diffusers' not in sys.modules\n"
        "assert 'wan2_2_predictor' in MODEL_REGISTRY\n"
        "assert 'wan22_train.plugin' in sys.modules and 'ltx2_train.plugin' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)


def test_a_plugin_module_that_does_not_import_is_named():
    with pytest.raises(
        PluginImportError, match="training.plugin: cannot import plugin module 'no_such_plugin'"
    ):
        import_plugins(["no_such_plugin"])
