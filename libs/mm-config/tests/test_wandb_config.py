"""``training.wandb``: what the section needs and refuses."""

from __future__ import annotations


def test_a_wandb_section_needs_only_a_project(container, load):
    wandb = load(container(training={"save": "runs/x", "wandb": {"project": "video-lora"}})).training.wandb
    assert (wandb.project, wandb.entity, wandb.name, wandb.group, wandb.tags, wandb.notes, wandb.mode) == (
        "video-lora", None, None, None, [], None, None,
    )  # fmt: skip


def test_wandb_without_save_or_log_dir_is_refused(container, load_error, problem_at):
    err = load_error(container(training={"wandb": {"project": "p"}}))
    assert "training.log_dir (or save)" in problem_at(err, "training.wandb")


def test_an_unknown_wandb_mode_is_refused(container, load_error, problem_at):
    err = load_error(container(training={"save": "runs/x", "wandb": {"project": "p", "mode": "disabled"}}))
    assert "online" in problem_at(err, "training.wandb.mode")
