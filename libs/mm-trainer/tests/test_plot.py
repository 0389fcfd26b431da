"""``mm-train plot RUN_DIR``: a PNG of metrics.jsonl as MetricsLogger writes it; clear errors otherwise."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
from mm_trainer import MetricsLogger
from mm_trainer.cli import main
from mm_trainer.tools.plot import read_metrics, smooth
from PIL import Image

WIDTH, ROW_HEIGHT, TITLE_HEIGHT = 900, 240, 60  # figsize (9, 2.4 x rows + 0.6) at 100 dpi


def write_run(log_dir: Path, steps: int = 20, *, val_every: int | None = None, rewards: bool = False) -> Path:
    """metrics.jsonl of a short run, written by the trainer's own logger."""
    logger = MetricsLogger(total_steps=steps, log_dir=log_dir, tensorboard=False)
    for step in range(1, steps + 1):
        logger.log(step, {"loss": 2.0 / step + 0.1 * math.sin(step), "lr": 1e-3 * min(1, step / 5),
                          "grad_norm": 1.0 / math.sqrt(step), "skipped": False})  # fmt: skip
        if val_every and step % val_every == 0:
            logger.log(step, {"val_loss": 1.5 / step, **({"val_reward": -1.0 / step} if rewards else {})})
    logger.close()
    return log_dir


def _png(path: Path) -> Image.Image:
    with Image.open(path) as image:
        assert image.format == "PNG"
        image.load()
        return image


def test_plot_writes_a_png_with_a_panel_per_series_and_one_for_validation_loss(tmp_path, capsys):
    run = write_run(tmp_path / "run", val_every=5)
    out = tmp_path / "plots" / "curves.png"
    assert main(["plot", str(run), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    image = _png(out)
    assert image.size == (WIDTH, 4 * ROW_HEIGHT + TITLE_HEIGHT)  # loss, lr, grad norm, validation loss
    assert len(image.convert("RGB").getcolors(maxcolors=1 << 16) or range(1 << 16)) > 20  # drawn, not blank


def test_validation_rewards_get_a_panel_of_their_own(tmp_path):
    run = write_run(tmp_path / "run", val_every=5, rewards=True)
    assert main(["plot", str(run)]) == 0
    assert _png(run / "metrics.png").size == (WIDTH, 5 * ROW_HEIGHT + TITLE_HEIGHT)


def test_without_validation_records_the_png_has_three_panels_beside_the_metrics(tmp_path):
    run = write_run(tmp_path / "run")
    assert main(["plot", str(run)]) == 0
    assert _png(run / "metrics.png").size == (WIDTH, 3 * ROW_HEIGHT + TITLE_HEIGHT)


def test_a_run_dir_without_metrics_is_refused_naming_it(tmp_path, capsys):
    assert main(["plot", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'nowhere'}: no metrics.jsonl there" in err and "training.log_dir" in err


def test_a_malformed_line_is_refused_naming_the_file_and_line(tmp_path, capsys):
    run = write_run(tmp_path / "run", steps=3)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join([lines[0], "{oops", *lines[1:]]) + "\n")
    assert main(["plot", str(run)]) == 2
    assert f"{run / 'metrics.jsonl'}:2: not JSON" in capsys.readouterr().err


def test_a_torn_last_line_of_a_running_job_is_left_out(tmp_path):
    run = write_run(tmp_path / "run", steps=4)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "lo')
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3, 4]


def test_without_matplotlib_the_error_names_the_extra(tmp_path, monkeypatch, capsys):
    run = write_run(tmp_path / "run", steps=3)
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    assert main(["plot", str(run)]) == 2
    assert "pip install 'mm-trainer[plot]'" in capsys.readouterr().err


def test_smoothing_is_a_debiased_moving_average():
    assert smooth([4.0, 4.0, 4.0], 0.9) == pytest.approx([4.0, 4.0, 4.0])  # no pull towards 0
    assert smooth([0.0, 10.0], 0.5) == pytest.approx([0.0, 5.0 / 0.75])
