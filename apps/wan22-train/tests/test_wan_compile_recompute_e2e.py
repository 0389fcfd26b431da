"""Regional compile and selective recompute change how tiny Wan2.2 trains, not what it trains.

Tiny Wan T2V, FSDP2 + Ulysses 2 on 2 forked gloo ranks (the shipped ``tiny_t2v.yaml``), 10 steps in
four combinations: eager / compiled predictor blocks (inductor, C++ on CPU) x no / selective
recompute. Each combination trains 10 steps saving after step 5, then resumes that checkpoint for
steps 6-10. Compiled blocks train the eager losses (rel 1e-5); selective recompute trains the losses of
no recompute (rel 1e-6); every combination resumes exactly. The compiled blocks trace mm-parallel's
Ulysses attention into their graphs (its all-to-alls are functional collectives).
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from wan22_train.configs import config_path
from wan22_train.tiny import make_tiny, tiny_overrides

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3000)]

BLOCKS = '["predictor.blocks.{*}"]'
COMBOS = {
    "eager_none": ["features.recompute_plan.apply_modules=[]"],
    "eager_selective": [f"features.recompute_plan.apply_modules={BLOCKS}", "features.recompute_plan.policy=selective"],
    "compiled_none": ["features.recompute_plan.apply_modules=[]", f"features.compile.apply_modules={BLOCKS}"],
    "compiled_selective": [f"features.recompute_plan.apply_modules={BLOCKS}", "features.recompute_plan.policy=selective",
                           f"features.compile.apply_modules={BLOCKS}"],
}  # fmt: skip


def train(distributed, tiny: Path, log_dir: Path, *overrides: str) -> list[dict]:
    """``wan22-train --config tiny_t2v.yaml ...`` on 2 ranks (Ulysses 2); the metrics records. Rank 0's
    trainer log goes to ``log_dir / "train.log"``, the number of graphs dynamo compiled to
    ``log_dir / "graphs.txt"``."""
    args = ["--config", str(config_path("tiny_t2v.yaml")), *tiny_overrides(tiny), "training.train_iters=10",
            "training.save=null", f"training.log_dir={log_dir}", *overrides]  # fmt: skip

    def body(rank: int, world_size: int) -> int:
        from torch._dynamo.utils import counters
        from wan22_train.cli import main

        counters.clear()  # a forked rank inherits the test process's counts (an earlier in-process compile)
        if rank == 0:
            log_dir.mkdir(parents=True, exist_ok=True)
            logging.getLogger("mm_trainer").addHandler(logging.FileHandler(log_dir / "train.log"))
        code = main(args)
        if rank == 0:
            (log_dir / "graphs.txt").write_text(str(counters["stats"]["unique_graphs"]))
        return code

    assert distributed(body, 2, timeout=1500) == [0, 0]
    return [json.loads(line) for line in (log_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, distributed) -> dict:
    """Per combination: the 10-step records, the records of steps 6-10 resumed from step 5, and the log."""
    root = tmp_path_factory.mktemp("wan_compile")
    tiny = make_tiny(root / "tiny")
    out = {}
    for name, overrides in COMBOS.items():
        ckpt = root / name
        whole = train(
            distributed, tiny, ckpt, f"training.save={ckpt}", "training.save_interval=5", *overrides
        )
        step_5 = root / f"{name}_step_5"
        shutil.copytree(ckpt / "iter_0000005", step_5 / "iter_0000005")
        resumed = train(distributed, tiny, root / f"{name}_resumed", f"training.load={step_5}", *overrides)
        graphs = int((ckpt / "graphs.txt").read_text())
        out[name] = {
            "whole": whole,
            "resumed": resumed,
            "log": (ckpt / "train.log").read_text(),
            "graphs": graphs,
        }
    return out


def losses(records: list[dict]) -> torch.Tensor:
    return torch.tensor([r["loss"] for r in records], dtype=torch.float64)


@pytest.mark.parametrize("recompute", ["none", "selective"])
def test_compiled_blocks_train_the_eager_losses(runs, recompute):
    compiled, eager = runs[f"compiled_{recompute}"]["whole"], runs[f"eager_{recompute}"]["whole"]
    assert len(eager) == 10
    assert runs[f"compiled_{recompute}"]["graphs"] > 0 and runs[f"eager_{recompute}"]["graphs"] == 0
    torch.testing.assert_close(losses(compiled), losses(eager), rtol=1e-5, atol=0)


@pytest.mark.parametrize("compiled", ["eager", "compiled"])
def test_selective_recompute_trains_the_losses_of_no_recompute(runs, compiled):
    selective, none = runs[f"{compiled}_selective"]["whole"], runs[f"{compiled}_none"]["whole"]
    torch.testing.assert_close(losses(selective), losses(none), rtol=1e-6, atol=0)


@pytest.mark.parametrize("combo", COMBOS)
def test_each_combination_resumes_exactly(runs, combo):
    whole, resumed = runs[combo]["whole"], runs[combo]["resumed"]
    assert [r["step"] for r in resumed] == list(range(6, 11))
    assert losses(resumed).tolist() == losses(whole)[5:].tolist()


def test_the_run_log_names_the_compile_and_recompute_choices(runs):
    log = runs["compiled_selective"]["log"]
    assert (
        "features: compile (torch.compile backend=inductor mode=default): 2 module(s): predictor.blocks.0"
        in log
    )
    assert "features: recompute (selective): 2 module(s): predictor.blocks.0, predictor.blocks.1" in log
    assert "features:" not in runs["eager_none"]["log"]
