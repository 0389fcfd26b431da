"""``mm-train check-layouts``: one config at several layouts, the same per-step losses or exit 1.

The command is mm-train's ``main`` called in the test process (``mm_train_in_process``); the runs it
compares are its own subprocesses, one interpreter or torchrun per layout. The root README's lines
(make-tiny, then check-layouts on the shipped tiny Wan config) run as a user types them from the
repository root, in a fresh directory (the configs read ``runs/tiny`` from the working directory)."""

from __future__ import annotations

import pytest
from mm_config import load_config
from mm_trainer.checks.layouts import GlobalBatch, Layout, common_global_batch

SECTIONS = {"training": {"global_batch_size": 8, "micro_batch_size": 2, "gradient_accumulation_steps": None}}
ROOT_README = "README.md"
MAKE_TINY = "hatch run wan22-train make-tiny runs/tiny"
CHECK = "hatch run mm-train check-layouts --config apps/wan22-train/configs/tiny_t2v.yaml --layouts 1 2 2:ulysses=2"


@pytest.mark.slow
def test_the_root_readmes_check_layouts_line_passes_on_the_shipped_tiny_config(
    readme, mm_train_in_process, tmp_path, monkeypatch
):
    # tiny_t2v.yaml sets ulysses 2 and no global batch: each layout resets ulysses, and all train the
    # global batch 4 (micro 2 x data-parallel 1, 2, 1 all divide it). Before, layout 1 kept ulysses 2
    # (invalid at world 1) and the command exited 2.
    from wan22_train.cli import main as wan22_main
    from wan22_train.configs import config_path

    monkeypatch.chdir(tmp_path)
    make_tiny = readme.command(ROOT_README, MAKE_TINY, extra=("--vae-fit-steps", "0"))  # no VAE fit: faster
    assert make_tiny[:3] == ["hatch", "run", "wan22-train"] and wan22_main(make_tiny[3:]) == 0
    paths = {"apps/wan22-train/configs": config_path("tiny_t2v.yaml").parent}
    check = readme.command(ROOT_README, CHECK, paths=paths, extra=("--work-dir", str(tmp_path / "layouts")))
    assert check[:4] == ["hatch", "run", "mm-train", "check-layouts"]
    proc = mm_train_in_process(*check[3:])
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "checking all at training.global_batch_size=4" in proc.stdout
    printed = proc.stdout.splitlines()  # make-tiny's lines, check-layouts' note, its table
    table = printed[next(i for i, line in enumerate(printed) if line.startswith("step")) :]
    assert table[0].split() == ["step", "1", "2", "2:ulysses=2"] and [row.split()[0] for row in table[1:5]] == [
        "1", "2", "3", "4",
    ]  # fmt: skip
    assert "(tolerance 0.0001, global batch 4): OK" in table[5]


@pytest.mark.slow
@pytest.mark.parametrize(("noise", "code"), [("keyed", 0), ("rank_seeded", 1)])
def test_keyed_draws_pass_and_a_rank_seeded_draw_fails(
    toy_yaml, mm_train_in_process, tmp_path, noise: str, code: int
):
    config = toy_yaml(noise, model={"pipeline": {"noise": noise}}, **SECTIONS)
    args = ["--layouts", "1", "2", "--steps", "3", "--work-dir", str(tmp_path / "runs")]
    proc = mm_train_in_process("check-layouts", "--config", str(config), *args)
    assert proc.returncode == code, proc.stdout + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["step", "1", "2"] and [line.split()[0] for line in lines[1:4]] == [
        "1",
        "2",
        "3",
    ]
    assert ("OK" if code == 0 else "FAILED") in lines[4]


def test_layouts_that_train_different_global_batches_are_refused_before_running(
    toy_yaml, mm_train_in_process, tmp_path
):
    config = toy_yaml(
        "fixed_accumulation"
    )  # gradient_accumulation_steps: 1, so the global batch follows the world
    args = ["--layouts", "1", "2", "--work-dir", str(tmp_path / "runs")]
    proc = mm_train_in_process("check-layouts", "--config", str(config), *args)
    assert proc.returncode == 2
    assert "different global batches {'1': 4, '2': 8}" in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_a_layout_spec_names_its_world_size_and_overrides():
    layout = Layout.parse("4:ulysses=2,micro=1")
    assert layout.world_size == 4
    assert layout.overrides == (
        "parallel.ulysses_parallel_size=2",
        "parallel.ring_attention_size=1",
        "parallel.replicate_parallel_size=auto",
        "parallel.fully_shard_parallel_size=auto",
        "training.micro_batch_size=1",
    )
    with pytest.raises(ValueError, match=r"'ulyses=2' is not key=integer with key one of"):
        Layout.parse("2:ulyses=2")


def test_a_layout_sets_the_parallel_keys_it_does_not_name_to_their_defaults(toy_yaml):
    # `--layouts 1 2 2:ulysses=2` of a config with ulysses 2: layout 2 is plain data parallelism (the
    # config's ulysses 2 kept at world 1 made layout 1 invalid: the command exited 2)
    config = toy_yaml("ulysses", parallel={"ulysses_parallel_size": 2}, **SECTIONS)
    resolved = {
        spec: load_config(config, Layout.parse(spec).overrides, world_size=Layout.parse(spec).world_size)
        for spec in ("1", "2", "2:ulysses=2")
    }
    assert {spec: cfg.parallel.ulysses_parallel_size for spec, cfg in resolved.items()} == {
        "1": 1,
        "2": 1,
        "2:ulysses=2": 2,
    }
    micro = {spec: cfg.training.micro_batch_size for spec, cfg in resolved.items()}
    assert micro == dict.fromkeys(resolved, 2)  # not a parallel key: the config's


def test_an_override_of_a_layouts_parallel_key_is_refused_naming_the_layouts_form(
    toy_yaml, mm_train_in_process, tmp_path
):
    config = toy_yaml("override", **SECTIONS)
    args = ["parallel.ulysses_parallel_size=2", "--layouts", "1", "2", "--work-dir", str(tmp_path / "runs")]
    proc = mm_train_in_process("check-layouts", "--config", str(config), *args)
    assert proc.returncode == 2
    assert "parallel.ulysses_parallel_size is set by each layout" in proc.stderr
    assert "name it in the layouts instead, e.g. --layouts 2 2:ulysses=2" in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_without_a_global_batch_every_layout_trains_the_smallest_that_all_divide(toy_yaml):
    # micro 4: layouts 1, 2 and 4:ulysses=2 would train 4, 8 and 8 samples per step
    config = toy_yaml("derived", training={"gradient_accumulation_steps": None})
    layouts = [Layout.parse(spec) for spec in ("1", "2", "4:ulysses=2")]
    batch = common_global_batch(config, layouts)
    assert batch.size == 8 and batch.overrides == ("training.global_batch_size=8",)
    assert "training.global_batch_size is not set" in batch.note
    assert "{'1': 4, '2': 8, '4:ulysses=2': 8}" in batch.note
    accumulation = [
        load_config(config, [*batch.overrides, *layout.overrides], world_size=layout.world_size).training
        for layout in layouts
    ]
    assert [t.gradient_accumulation_steps for t in accumulation] == [2, 1, 1]
    assert common_global_batch(config, layouts, batch.overrides) == GlobalBatch(8)  # set: no note
