"""Samples that would hang the step: a FIFO (or any non-regular file) is refused before it is opened, and a
read that blocks is a bad sample after ``decode_timeout_s``; ``mm-data check`` reports both, in parallel.

Each call that today's code would block on runs in a daemon thread joined with a time limit, so a
regression fails the test instead of hanging it; the FIFOs' blocked readers are released at teardown.
The two tests that fork DataLoader workers run in a new interpreter, as ``mm-data check`` and a trainer do:
forked from a pytest worker, the workers hung at the fork itself in full CI runs (freeing an FFmpeg context
of the worker's earlier tests whose threads a forked child does not have: ``tests/test_decode_after_fork.py``
covers the one found in mm-data's decoder; another, from the pytest worker's history, was not found).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from mm_data import MultimodalPlugin, SampleError, VideoTextDataset, make_synthetic_dataset

SIZE = {"num_frames": 5, "height": 16, "width": 16}


def finishes(call: Callable[[], object], within_s: float) -> object:
    """``call()``'s result, failing the test when it has not returned within ``within_s`` seconds."""
    outcome: list = []
    worker = threading.Thread(target=lambda: outcome.append(call()), daemon=True)
    worker.start()
    worker.join(within_s)
    assert not worker.is_alive(), f"still blocked after {within_s} s"
    return outcome[0]


@pytest.fixture
def fifo(tmp_path):  # noqa: ANN201
    """A FIFO named like a clip; a reader still blocked on it at teardown is released (EOF)."""
    path = tmp_path / "stalled.mp4"
    os.mkfifo(path)
    yield path
    try:  # succeeds only while a reader waits: open for writing and close, the reader sees EOF
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


@pytest.fixture(scope="module")
def two_clips(tmp_path_factory) -> Path:
    """Two good 9-frame 16x16 clips and their metadata."""
    return make_synthetic_dataset(
        tmp_path_factory.mktemp("clips"), num_clips=2, sizes=[(16, 16)], fps=8, num_frames=9
    )


def metadata_with(first: Path, clips: Path, out: Path) -> Path:
    """``clips``' metadata with ``first`` listed before them."""
    rows = json.loads(clips.read_text())
    for row in rows:
        row["path"] = str(clips.parent / row["path"])
    out.write_text(json.dumps([{**rows[0], "path": str(first)}, *rows]))
    return out


def test_a_fifo_listed_as_a_clip_is_a_bad_sample_named_at_once(fifo, two_clips, tmp_path):
    dataset = VideoTextDataset(
        metadata_with(fifo, two_clips, tmp_path / "meta.json"), **SIZE, max_bad_fraction=0.5
    )
    item = finishes(lambda: dataset[0], within_s=10)
    assert item["index"] == 1 and item["skipped"] == [0]
    (bad,) = dataset.bad_samples
    assert bad.path == str(fifo) and "a FIFO (named pipe), not a regular file" in bad.reason


def test_a_directory_or_fifo_given_as_media_is_refused_without_opening_it(fifo, tmp_path):
    plugin = MultimodalPlugin.__new__(MultimodalPlugin)  # load_image reads no tokenizer state
    error = finishes(lambda: _error_of(lambda: plugin.load_image(str(fifo))), within_s=10)
    assert isinstance(error, SampleError) and f"image {fifo}: a FIFO (named pipe)" in str(error)
    with pytest.raises(SampleError, match=r"video .*: a directory, not a regular file"):
        plugin.load_video(str(tmp_path))


def _error_of(call: Callable[[], object]) -> Exception | None:
    """The exception ``call()`` raises, or None."""
    try:
        call()
    except Exception as exc:  # noqa: BLE001
        return exc
    return None


def _hang_on(path: Path, fifo: Path) -> Callable:
    """A ``decode_frames`` that blocks in the kernel (opening ``fifo``) for ``path`` and decodes the rest."""
    from mm_data import dataset as dataset_module

    real = dataset_module.decode_frames

    def decode(source, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if str(source) == str(path):
            with open(fifo, "rb") as stalled:  # waits for a writer: a read that never returns
                stalled.read()
        return real(source, *args, **kwargs)

    return decode


@pytest.mark.parametrize("deadline", [0.3, 1.0])
def test_a_read_that_blocks_is_a_bad_sample_after_decode_timeout_s(
    monkeypatch, fifo, two_clips, tmp_path, deadline
):
    from mm_data import dataset as dataset_module

    rows = json.loads(two_clips.read_text())
    hung = two_clips.parent / rows[0]["path"]
    monkeypatch.setattr(dataset_module, "decode_frames", _hang_on(hung, fifo))
    dataset = VideoTextDataset(two_clips, **SIZE, max_bad_fraction=0.5, decode_timeout_s=deadline)
    started = time.monotonic()
    item = finishes(lambda: dataset[0], within_s=deadline + 10)
    assert time.monotonic() - started >= deadline  # the deadline, not the read, ended the wait
    assert item["index"] == 1 and item["skipped"] == [0]
    (bad,) = dataset.bad_samples
    assert bad.path == str(hung) and f"not read within decode_timeout_s={deadline:g} s" in bad.reason


def in_fresh_python(code: str, *args: str, within_s: float = 90) -> subprocess.CompletedProcess:
    """``code`` run by a new interpreter with ``args``: these tests fork DataLoader workers, and a process that
    forks must not carry the pytest worker's history (see the module docstring)."""
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=within_s
    )


def test_mm_data_check_lists_a_fifo_with_its_path_in_parallel(fifo, two_clips, tmp_path):
    meta = metadata_with(fifo, two_clips, tmp_path / "meta.json")
    args = ["check", str(meta), "--num-frames", "5", "--height", "16", "--width", "16", "--workers", "2"]
    run = in_fresh_python(
        "import sys; from mm_data.cli import main; sys.exit(main(sys.argv[1:]))",
        *args,
        "--decode-timeout-s",
        "5",
    )
    assert run.returncode == 1, run.stderr
    assert "3 samples, 1 bad" in run.stdout and f"[0] {fifo}: a FIFO (named pipe)" in run.stdout
    assert "checked 3/3 samples, 1 bad" in run.stderr  # progress


DEADLINE_IN_A_WORKER = """
import json, sys
from pathlib import Path
from mm_data import VideoTextDataset
from mm_data import dataset as dataset_module
from torch.utils.data import DataLoader

meta, fifo = Path(sys.argv[1]), Path(sys.argv[2])
hung = meta.parent / json.loads(meta.read_text())[0]["path"]
real = dataset_module.decode_frames

def decode(source, *args, **kwargs):  # blocks in the kernel (opening the FIFO) for the first clip
    if str(source) == str(hung):
        with open(fifo, "rb") as stalled:
            stalled.read()
    return real(source, *args, **kwargs)

dataset_module.decode_frames = decode  # the forked worker inherits the patched reader
dataset = VideoTextDataset(meta, num_frames=5, height=16, width=16, max_bad_fraction=0.5, decode_timeout_s=0.5)
loader = DataLoader(dataset, batch_size=None, num_workers=1, multiprocessing_context="fork")
item = next(iter(loader))
print(json.dumps({"index": item["index"], "skipped": item["skipped"]}))
"""


def test_the_deadline_holds_in_a_dataloader_worker(fifo, two_clips):
    run = in_fresh_python(DEADLINE_IN_A_WORKER, str(two_clips), str(fifo), within_s=60)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.strip().splitlines()[-1]) == {"index": 1, "skipped": [0]}
