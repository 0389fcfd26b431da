"""mm-trainer's rooms: every module sits in the room of its concern, each room says what it holds, and
the public API stayed where it was (``from mm_trainer import ...``). The rules between the rooms are the
import-linter contracts of the root pyproject.toml (``trainer-rooms``, ``trainer-commands``), run by
``hatch run lint`` and tests/test_lint_checks.py."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import mm_trainer
import pytest

PACKAGE = Path(mm_trainer.__file__).parent
README = PACKAGE.parents[1] / "README.md"
ROOMS = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())
ENTRY_MODULES = {"__init__.py", "__main__.py", "trainer.py", "cli.py"}

# Every name `from mm_trainer import ...` gave before the modules moved into rooms (2026-12-07).
PUBLIC_NAMES = """
AutoencoderFit BaseModel BatchStream ConditionStream DATA_REGISTRY FIT_REPORT FSDP_AUTO_BYTES FeaturesReport
HFModel LoraAdapters LoraTargets MODEL_REGISTRY MetricsLogger ModelContainer ModelContainerHub ModelHub
NonFiniteGuard NonFiniteLossError PEAK_FLOPS ParameterEMA Phase PhaseSchedulers Registry RegistryError
ResumeSettingsError RunDirectory RunDirectoryError RunLock RunLockedError RunStart SAVED_OPS StopSignals
TrainEngine Trainer TransformersKeyRenaming Validator apply_features build_batch_stream build_dataset
build_phases check_compile check_resume compare_settings conversation_dataset data_register
enable_vae_tiling export_hf_model feature_plans fit_autoencoder fit_or_reuse_autoencoder fit_report
fit_summary freeze fsdp_plan_from_config hf_model_class holds_a_run import_plugins init_module_weights
inject_lora keep_configured_hyperparameters latent_statistics load_frozen load_module_weights
load_offline_config load_run_config model_register open_run_directory plan_features posterior_means
preflight preprocess_ranks preprocess_section reconstruct refuse_dropped_tensors registered_names
save_fitted selective_recompute_contexts shard_frozen state_is_finite use_text_encoder_fsdp
weight_sources weights_bytes weights_identity write_latent_cache
""".split()


def test_every_public_name_of_the_flat_layout_still_imports_from_the_package():
    module = importlib.import_module("mm_trainer")
    assert [name for name in PUBLIC_NAMES if not hasattr(module, name)] == []
    assert set(PUBLIC_NAMES) <= set(module.__all__)


def test_only_the_entry_points_sit_directly_in_the_package():
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in ENTRY_MODULES)
    assert loose == [], f"modules outside a room: {loose} (put each in the room of its concern)"


@pytest.mark.parametrize("room", ROOMS)
def test_each_room_names_every_module_it_holds_in_its_docstring(room):
    docstring = ast.get_docstring(ast.parse((PACKAGE / room / "__init__.py").read_text())) or ""
    modules = sorted(p.stem for p in (PACKAGE / room).glob("*.py") if p.name != "__init__.py")
    assert modules, f"{room}/ holds no module"
    if (
        room == "planner"
    ):  # the planner's package docstring describes the command; its modules name themselves
        return
    unnamed = [m for m in modules if f"``{m}``" not in docstring]
    assert unnamed == [], f"{room}/__init__.py does not say what {unnamed} hold"


def test_the_readme_layout_shows_every_room_once():
    text = README.read_text()
    tree = text[text.index("## Layout") :].split("```")[1]
    shown = re.findall(r"── (\w+)/", tree)
    assert sorted(shown) == ROOMS
