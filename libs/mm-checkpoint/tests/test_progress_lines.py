"""A conversion, export or load where stderr is no terminal (a log file, CI) says how far it got in
plain lines, with a rate and the time left; a short one prints nothing."""

from __future__ import annotations

import re

from mm_checkpoint import runtime
from mm_checkpoint.runtime import progress


def test_without_a_terminal_a_long_loop_prints_its_count_rate_and_time_left(monkeypatch, capsys):
    monkeypatch.setattr(runtime, "PROGRESS_INTERVAL_S", 0.0)
    assert list(progress(range(3), desc="convert model -> dcp", total=3, unit="tensor")) == [0, 1, 2]
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" | ")[0] for line in lines] == [
        f"convert model -> dcp: {i}/3 tensor" for i in (1, 2, 3)
    ]
    assert all(re.search(r"\| [\d.e+]+ tensor/s \| eta \d+:\d\d:\d\d$", line) for line in lines), lines


def test_a_loop_shorter_than_the_interval_prints_nothing(capsys):
    assert list(progress(range(3), desc="convert model -> dcp", total=3)) == [0, 1, 2]
    assert capsys.readouterr().err == ""
