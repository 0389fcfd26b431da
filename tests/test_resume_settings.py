"""A resume never acts on settings other than the ones it reports: changed settings that define the
checkpoint are refused naming both values, the others take effect (logged at start, proved by the
losses), and what a checkpoint holds is checked before it is used.

One LoRA toy run trains 4 steps and saves iteration 4; each test resumes a copy of its own.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from mm_trainer.run.exit_codes import EXIT_CONFIG

pytestmark = pytest.mark.slow

LORA = {"target_modules": ["blocks.{*}.fc1", "blocks.{*}.fc2"], "rank": 2, "alpha": 4.0}
BASE = {
    "model": {"models": {"predictor": {"lora": LORA}}},
    "training": {"train_iters": 4, "save_interval": 4, "log_sample_ids": True, "weight_decay": 0.01},
}


@pytest.fixture(scope="module")
def base(module_toy_yaml, mm_train_forked) -> Path:
    """The config of the shared run; its checkpoint (iteration 4) is in ``<config dir>/ckpt``."""
    import peft  # noqa: F401 - imported once here, not in every forked run (2 s each)

    config = module_toy_yaml("base", **BASE)
    mm_train_forked(config)
    return config


def resumed_copy(base: Path, tmp_path: Path) -> Path:
    """A copy of the shared run (its config and checkpoint), to resume in place; returns its config."""
    run = tmp_path / "run"
    shutil.copytree(base.parent / "ckpt", run / "ckpt", ignore=shutil.ignore_patterns(".mm_train*"))
    config = yaml.safe_load(base.read_text())
    config["training"]["save"] = str(run / "ckpt")
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    return run / "config.yaml"


def losses(records: list[dict]) -> list[float]:
    return [r["loss"] for r in records]


@pytest.fixture(scope="module")
def continued(base, mm_train_forked, tmp_path_factory) -> list[dict]:
    """Steps 5-8 of the run resumed with its own settings: the reference the changed resumes differ from."""
    return mm_train_forked(resumed_copy(base, tmp_path_factory.mktemp("same")), "training.train_iters=8")[4:]


@pytest.mark.parametrize(
    ("override", "logged"),
    [
        ("training.lr=0.001", "training.lr: 0.003 -> 0.001"),
        ("training.weight_decay=50.0", "training.weight_decay: 0.01 -> 50.0"),
    ],
    ids=["lr", "weight_decay"],
)
def test_a_changed_optimizer_setting_on_resume_is_applied_logged_and_recorded(
    override, logged, base, continued, mm_train_forked, tmp_path, capfd
):
    config = resumed_copy(base, tmp_path)
    records = mm_train_forked(config, "training.train_iters=8", override)[4:]
    assert f"changed on resume: {logged}" in capfd.readouterr().err
    assert [r["step"] for r in records] == [5, 6, 7, 8]
    assert records[0]["loss"] == continued[0]["loss"]  # step 5 runs on the checkpoint's weights
    assert all(
        a != b for a, b in zip(losses(records[1:]), losses(continued[1:]))
    )  # then the new setting acts
    key, value = override.split("=")
    saved = yaml.safe_load((config.parent / "ckpt" / "config.yaml").read_text())
    assert saved["training"][key.split(".")[1]] == float(value)
    if key == "training.lr":
        assert {r["lr"] for r in records} == {0.001}


def test_narrower_lora_targets_on_resume_are_refused_naming_the_dropped_layers(
    base, mm_train_forked, tmp_path
):
    config = resumed_copy(base, tmp_path)
    with pytest.raises(AssertionError) as failure:
        mm_train_forked(config, 'model.models.predictor.lora.target_modules=["blocks.{*}.fc1"]')
    message = str(failure.value)
    assert "ResumeSettingsError" in message
    assert (
        "model.models.predictor.lora.target_modules: ['blocks.{*}.fc1', 'blocks.{*}.fc2'] -> ['blocks.{*}.fc1']"
        in message
    )
    assert "predictor.blocks.0.fc2, predictor.blocks.1.fc2, predictor.blocks.2.fc2" in message


def test_a_changed_lora_alpha_on_resume_is_refused_with_both_values_as_a_config_error(
    base, mm_train_result, tmp_path
):
    done = mm_train_result(resumed_copy(base, tmp_path), "model.models.predictor.lora.alpha=8.0")
    assert done.returncode == EXIT_CONFIG, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    (start,) = [line for line in done.stderr.splitlines() if line.startswith("mm-train: error: ")]
    assert start.startswith(f"mm-train: error: resuming {tmp_path / 'run' / 'ckpt'} with settings that")
    assert "model.models.predictor.lora.alpha: 4.0 -> 8.0" in done.stderr.split(start)[1]


def test_an_lr_blow_up_saves_none_of_its_non_finite_steps(base, mm_train_forked, tmp_path, capfd):
    config = resumed_copy(base, tmp_path)
    # step 5 still has a finite loss (the checkpoint's weights) and saves; its update makes the weights
    # ~1e30, so every later loss is inf: skipped, and never saved, until the run stops. Iteration 5 was
    # the input of the first of them: withdrawn, the tracker back at 4
    # (test_trainer_robustness.py: ..._withdraws_the_checkpoint_of_its_finite_loss_step_...)
    blow_up = ["training.lr=1e30", "training.save_interval=1", "training.train_iters=12",
               "training.nonfinite.max_consecutive=3"]  # fmt: skip
    with pytest.raises(AssertionError, match="NonFiniteLossError: step 9: non-finite loss"):
        mm_train_forked(config, *blow_up)
    ckpt = config.parent / "ckpt"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "4"
    assert sorted(p.name for p in ckpt.glob("iter_*")) == ["iter_0000004", "iter_0000005"]
    err = capfd.readouterr().err
    assert all(f"not saving iteration {i}: the step's loss is not finite" in err for i in (6, 7, 8))


def test_reset_data_position_acts_when_resuming_in_place(base, mm_train_forked, tmp_path, capfd):
    first_step = json.loads((base.parent / "ckpt" / "metrics.jsonl").read_text().splitlines()[0])
    records = mm_train_forked(
        resumed_copy(base, tmp_path), "training.train_iters=5", "training.reset_data_position=true"
    )
    assert records[-1]["step"] == 5 and records[-1]["sample_ids"] == first_step["sample_ids"]
    assert "data position reset to epoch 0" in capfd.readouterr().err


def test_a_negative_consumed_samples_in_a_rank_state_is_refused_naming_the_file(
    base, mm_train_forked, tmp_path
):
    config = resumed_copy(base, tmp_path)
    path = config.parent / "ckpt" / "iter_0000004" / "rank_state" / "dp_rank_00000.pt"
    saved = torch.load(path, weights_only=True)
    saved["state"]["dataloader"]["loader"]["consumed_samples"] = -4
    torch.save(saved, path)
    with pytest.raises(
        AssertionError,
        match=rf"CheckpointLoadError: 'dataloader' from \['{path}'\]: sampler state has consumed_samples=-4",
    ):
        mm_train_forked(config, "training.train_iters=5")


def test_a_checkpoint_records_where_each_sub_models_weights_came_from(base):
    from mm_checkpoint.info_file import read_info

    info = read_info(base.parent / "ckpt" / "iter_0000004")
    config = yaml.safe_load(base.read_text())["model"]["models"]
    assert info["sources"] == {
        name: str(Path(sub["from_pretrained"]).resolve()) for name, sub in config.items()
    }
