"""Tiny Wan2.2 with a fixed global batch of 4 is one run at any layout.

The reference trains 8 steps at world 2 (dp 2) and saves after step 4. Uninterrupted 8-step runs at
world 1, world 2 with Ulysses 2 and world 4 (dp 2 x Ulysses 2) train its losses (rel 1e-4) on the
same samples, and so do runs that resume its step-4 checkpoint at each of those layouts (steps 5-8).
Accumulation is derived per layout (2, 2, 1) from training.global_batch_size.

Each run is ``wan22-train``'s ``main`` on real gloo process groups of forked ranks (the ``main_forked``
fixture): the command line's code path without a fresh interpreter per run.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from wan22_train.cli import main as wan22_main
from wan22_train.configs import config_path
from wan22_train.tiny import make_tiny, tiny_overrides

pytestmark = pytest.mark.slow

LAYOUTS = {"world1": (1, 1), "world2_ulysses2": (2, 2), "world4_dp2_ulysses2": (4, 2)}


def train(main_forked, tiny: Path, log_dir: Path, world: int, ulysses: int, *overrides: str) -> list[dict]:
    """``wan22-train --config tiny_t2v.yaml ...`` on ``world`` ranks; returns its metrics records."""
    args = ["--config", str(config_path("tiny_t2v.yaml")), *tiny_overrides(tiny),
            f"parallel.ulysses_parallel_size={ulysses}", "training.global_batch_size=4",
            "training.gradient_accumulation_steps=null", "training.train_iters=8", "training.log_sample_ids=true",
            "training.save=null", f"training.log_dir={log_dir}", *overrides]  # fmt: skip
    main_forked(wan22_main, args, world, timeout=900)
    return [json.loads(line) for line in (log_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, main_forked) -> dict:
    """The world-2 (dp 2) run: its records, and its checkpoint after step 4 alone in a folder."""
    root = tmp_path_factory.mktemp("wan_elastic")
    tiny = make_tiny(root / "tiny")
    ckpt = root / "ckpt"
    records = train(main_forked, tiny, ckpt, 2, 1, f"training.save={ckpt}", "training.save_interval=4")
    after_step_4 = root / "after_step_4"
    shutil.copytree(ckpt / "iter_0000004", after_step_4 / "iter_0000004")  # the single valid iter_* dir
    return {"tiny": tiny, "root": root, "records": records, "after_step_4": after_step_4}


def assert_same_steps(records: list[dict], expected: list[dict]) -> None:
    assert [r["step"] for r in records] == [r["step"] for r in expected]
    assert [r["sample_ids"] for r in records] == [r["sample_ids"] for r in expected]
    torch.testing.assert_close(
        torch.tensor([r["loss"] for r in records]),
        torch.tensor([r["loss"] for r in expected]),
        rtol=1e-4,
        atol=0,
    )


def test_the_reference_trains_every_sample_once_over_four_epochs(reference):
    records = reference["records"]
    assert [r["step"] for r in records] == list(range(1, 9))
    assert [i for r in records for i in r["sample_ids"]] == list(range(32))  # 8 clips: 2 steps an epoch


@pytest.mark.parametrize("layout", LAYOUTS)
def test_an_uninterrupted_run_at_another_layout_trains_the_reference_losses(reference, main_forked, layout):
    world, ulysses = LAYOUTS[layout]
    records = train(main_forked, reference["tiny"], reference["root"] / f"whole_{layout}", world, ulysses)
    assert_same_steps(records, reference["records"])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_step_4_checkpoint_resumed_at_another_layout_trains_the_reference_steps_5_to_8(
    reference, main_forked, layout
):
    world, ulysses = LAYOUTS[layout]
    load = f"training.load={reference['after_step_4']}"
    log_dir = reference["root"] / f"resumed_{layout}"
    records = train(main_forked, reference["tiny"], log_dir, world, ulysses, load)
    assert_same_steps(records, reference["records"][4:])
