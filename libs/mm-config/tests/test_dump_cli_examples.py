"""Dumps round-trip, the CLI exits 0/2, the shipped examples validate, and importing pulls no torch."""

from __future__ import annotations

import subprocess
import sys

import pytest
from mm_config import dump_config, load_config


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mm_config", *args], capture_output=True, text=True, timeout=300
    )


def test_dump_round_trips_through_load_config(tmp_path, load, container):
    cfg = load(
        container(
            parallel={"ulysses_parallel_size": 2, "fsdp_plan": {"param_dtype": "bfloat16"}},
            training={"lr": 1e-5},
        ),
        world_size=4,
    )
    path = dump_config(cfg, tmp_path / "out" / "resolved.yaml")
    again = load_config(path, world_size=4)
    assert again == cfg
    assert again.parallel.fully_shard_parallel_size == 4 and again.training.global_batch_size == 2


def test_a_dump_that_fails_midway_leaves_the_previous_file_whole(tmp_path, load, container, monkeypatch):
    """A run resumed after a SIGKILL compares its settings with the saved config: a write cut short must
    never leave it truncated."""
    import mm_config.loader as loader

    path = dump_config(load(container(), world_size=1), tmp_path / "saved" / "config.yaml")
    before = path.read_text()

    def disk_full(fd):  # the new text is written, but never reaches the disk
        raise OSError("disk full")

    monkeypatch.setattr(loader.os, "fsync", disk_full)
    with pytest.raises(OSError, match="disk full"):
        dump_config(load(container(training={"lr": 1e-5}), world_size=1), path)
    assert path.read_text() == before
    assert sorted(p.name for p in path.parent.iterdir()) == ["config.yaml"]  # no temporary left beside it


@pytest.mark.parametrize(("name", "world"), [("wan", 8), ("ltx", 2), ("ltx", 8)])
def test_example_configs_validate_and_round_trip(example_configs, tmp_path, name, world):
    cfg = load_config(example_configs[name], world_size=world)
    assert load_config(dump_config(cfg, tmp_path / "r.yaml"), world_size=world) == cfg


def test_wan_example_carries_the_a14b_values(example_configs):
    cfg = load_config(example_configs["wan"], world_size=8)
    subs = cfg.model.sub_models()
    pred = subs["predictor"]
    assert (pred.model_id, pred.meta_init, pred.dtype, pred.freeze) == (
        "wan2_2_predictor",
        True,
        "fp32",  # fp32 master weights; FSDP computes in bf16
        False,
    )
    assert cfg.parallel.fsdp_plan.param_dtype == "bf16"
    c = pred.config
    assert (c["num_layers"], c["dim"], c["num_heads"], c["ffn_dim"], c["text_dim"]) == (
        40,
        5120,
        40,
        13824,
        4096,
    )
    assert (c["in_dim"], c["out_dim"], c["freq_dim"], c["patch_size"], c["eps"], c["text_len"]) == (
        16,
        16,
        256,
        [1, 2, 2],
        1e-6,
        512,
    )
    assert subs["ae"].freeze and subs["text_encoder"].freeze and subs["text_encoder"].meta_init
    assert cfg.training.trainable_submodels == ["predictor"]
    assert (cfg.parallel.cp_size, cfg.parallel.dp_size, cfg.parallel.fully_shard_parallel_size) == (8, 1, 8)


def test_ltx_example_is_the_single_model_form(example_configs):
    cfg = load_config(example_configs["ltx"], world_size=8)
    assert list(cfg.model.sub_models()) == ["model"] and cfg.model.model_id == "ltx2_predictor"
    c = cfg.model.config
    assert (
        c["num_layers"],
        c["num_attention_heads"],
        c["attention_head_dim"],
        c["in_channels"],
        c["caption_channels"],
    ) == (48, 32, 128, 128, 3840)


def test_cli_check_prints_the_resolved_config_and_exits_0(example_configs):
    proc = run_cli(
        "check", str(example_configs["wan"]), "--world-size", "8", "training.lr=2e-5", "--no-path-check"
    )
    assert proc.returncode == 0, proc.stderr
    assert "fully_shard_parallel_size: 8" in proc.stdout and "lr: 2.0e-05" in proc.stdout


def test_cli_check_on_a_typo_exits_2_and_suggests_the_key(write_config):
    path = write_config({"parallel": {"ulysses_parallel_sise": 2}})
    proc = run_cli("check", str(path))
    assert proc.returncode == 2
    assert "parallel.ulysses_parallel_sise: unknown key; did you mean `ulysses_parallel_size`?" in proc.stderr
    assert proc.stdout == ""


def test_console_script_is_installed_and_works(example_configs):
    import shutil
    from pathlib import Path

    script = Path(sys.executable).parent / "mm-config"
    exe = str(script) if script.exists() else shutil.which("mm-config")
    assert exe, "the mm-config console script is not installed in this environment"
    proc = subprocess.run(
        [exe, "check", str(example_configs["ltx"]), "--world-size", "8", "--no-path-check"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr


def test_importing_mm_config_does_not_import_torch():
    code = "import sys, mm_config, mm_config.cli; print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"
