"""``parallel.ulysses_overlap``: the tiny Wan T2V run at Ulysses 2 logs the loss and gradient norm of the
run without overlap (``off``), bitwise, with ``auto`` (on the CPU: 2 head groups, the projections not
overlapped) and with the projections overlapped; an explicit ``head_groups`` reaches the models the way
``auto``'s does (the last test), so it gets no run of its own (CI time)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mm_config import TrainConfig
from mm_parallel import UlyssesOverlap
from mm_trainer.model.build import parallel_state_for
from wan22_train.cli import main as wan22_main
from wan22_train.configs import config_path
from wan22_train.tiny import make_tiny, tiny_overrides

VALUES = {
    "off": ["parallel.ulysses_overlap=off"],
    "auto": ["parallel.ulysses_overlap=auto"],
    "projections": ["parallel.ulysses_overlap.projections=true", "parallel.ulysses_overlap.head_groups=1"],
}


def _first_step(main_forked, tiny: Path, save: Path, overrides: list[str]) -> tuple[float, float]:
    args = ["--config", str(config_path("tiny_t2v.yaml")), *tiny_overrides(tiny), f"training.save={save}",
            "training.train_iters=1", "training.save_interval=100", "parallel.ulysses_parallel_size=2",
            *overrides]  # fmt: skip
    main_forked(wan22_main, args, nproc=2)
    record = json.loads((save / "metrics.jsonl").read_text().splitlines()[0])
    return record["loss"], record["grad_norm"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return make_tiny(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def off(tiny, tmp_path_factory, main_forked) -> tuple[float, float]:
    return _first_step(main_forked, tiny, tmp_path_factory.mktemp("off"), VALUES["off"])


@pytest.mark.slow
@pytest.mark.parametrize("value", ["auto", "projections"])
def test_each_ulysses_overlap_logs_the_loss_of_the_run_without_overlap(
    tiny, off, tmp_path, main_forked, value
):
    assert _first_step(main_forked, tiny, tmp_path, VALUES[value]) == off


def test_the_config_key_reaches_the_parallel_state_auto_as_the_device_default() -> None:
    def state(overlap):  # noqa: ANN001, ANN202
        parallel = {"ulysses_parallel_size": 2, "ulysses_overlap": overlap}
        config = TrainConfig.model_validate({"parallel": parallel}, context={"world_size": 2})
        return parallel_state_for(config, 2, "cpu").ulysses_overlap

    assert state("auto") == UlyssesOverlap(heads=None, projections=None)
    assert state("off") == UlyssesOverlap(heads=1, projections=False)
    assert state({"projections": True, "head_groups": 4}) == UlyssesOverlap(heads=4, projections=True)
