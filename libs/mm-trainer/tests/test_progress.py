"""Long steps outside training say how far they got: plain lines with a rate and the time left where
stderr is no terminal (a log file, CI), nothing for a step shorter than the line interval."""

from __future__ import annotations

import io
import re
from types import SimpleNamespace

import torch
from mm_trainer import fit_autoencoder
from mm_trainer.tools import progress as progress_module
from mm_trainer.tools.progress import PhaseLog, Progress, progress_line
from torch import nn


class Autoencoder(nn.Module):
    """The interface of diffusers' VAEs: encode(x).latent_dist.mean, decode(z).sample."""

    def __init__(self) -> None:
        super().__init__()
        self.enc, self.dec = nn.Linear(8, 4), nn.Linear(4, 8)

    def encode(self, x):
        return SimpleNamespace(latent_dist=SimpleNamespace(mean=self.enc(x)))

    def decode(self, z):
        return SimpleNamespace(sample=self.dec(z))


def test_a_progress_line_holds_the_count_the_rate_and_the_time_left_at_that_rate():
    line = progress_line("forward", 12, 40, "FSDP units", 10.0)
    assert line == "forward 12/40 FSDP units | 1.2 FSDP units/s | eta 0:00:23"
    unknown = progress_line("encoding", 6, None, "FSDP units", 3.0)
    assert unknown == "encoding 6 FSDP units | 2 FSDP units/s | eta ?"


def test_without_a_terminal_a_counted_phase_prints_lines_and_its_last_count():
    out = io.StringIO()
    with Progress("backward", 3, "FSDP units", prefix="plan: ", stream=out, interval_s=0) as bar:
        for _ in range(3):
            bar.advance()
    lines = out.getvalue().splitlines()
    assert [re.sub(r" \| .*", "", line) for line in lines] == [
        "plan: backward 1/3 FSDP units",
        "plan: backward 2/3 FSDP units",
        "plan: backward 3/3 FSDP units",
    ]
    assert lines[-1].endswith("| eta 0:00:00")


def test_a_phase_shorter_than_the_interval_prints_no_count():
    out = io.StringIO()
    with PhaseLog("dry run", stream=out).count("forward", 2, "FSDP units") as bar:  # interval 10 s
        bar.advance(2)
    assert out.getvalue() == ""


def test_a_phase_line_says_the_seconds_since_the_command_started():
    out = io.StringIO()
    PhaseLog("dry run", stream=out)("micro-step 1/1: forward\nmore detail")
    assert out.getvalue() == "[dry run     0 s] micro-step 1/1: forward\n"


def test_the_autoencoder_fit_counts_its_steps_under_its_label(monkeypatch, capsys):
    monkeypatch.setattr(progress_module, "INTERVAL_S", 0.0)
    torch.manual_seed(0)
    fit_autoencoder(Autoencoder(), torch.randn(4, 8), steps=3, progress="fitting the tiny VAE")
    counts = [re.sub(r" \| .*", "", line) for line in capsys.readouterr().err.splitlines()]
    assert counts == [f"fitting the tiny VAE {i}/3 steps" for i in (1, 2, 3)]
