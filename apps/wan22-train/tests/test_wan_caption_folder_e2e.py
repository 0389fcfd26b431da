"""A caption folder (``clip.mp4`` + ``clip.txt``) as ``data.data_path`` trains what a metadata file of the
same clips trains.

The tiny Wan2.2 set's clips are copied into a folder with each one's caption beside it as ``.txt``; the
metadata file of the comparison lists the same clips, in the folder's sorted order, with the same captions
(and the tiny set's frame counts, rates and sizes). Each trains 4 steps of ``tiny_t2v.yaml`` on one
forked gloo rank with caption dropout on: the same samples at every step and the same losses.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from wan22_train.cli import main as wan22_main
from wan22_train.configs import config_path
from wan22_train.tiny import make_tiny, tiny_overrides

pytestmark = pytest.mark.slow


def caption_folder_and_metadata(tiny: Path) -> tuple[Path, Path]:
    """The tiny clips in ``tiny/captioned`` with a ``.txt`` caption each, and a metadata file of the same."""
    folder, rows = tiny / "captioned", []
    folder.mkdir()
    for row in json.loads((tiny / "data" / "metadata.json").read_text()):
        clip = folder / row["path"]
        shutil.copy(tiny / "data" / row["path"], clip)
        caption = row.pop("cap")[0]
        clip.with_suffix(".txt").write_text(caption + "\n")
        rows.append({**row, "path": str(clip), "caption": caption})
    metadata = tiny / "same_clips.json"
    metadata.write_text(json.dumps(sorted(rows, key=lambda r: r["path"])))
    return folder, metadata


def train(main_forked, tiny: Path, data_path: Path, log_dir: Path) -> list[dict]:
    args = ["--config", str(config_path("tiny_t2v.yaml")), *tiny_overrides(tiny), f"data.data_path={data_path}",
            "data.dataset.caption_dropout=0.3", "parallel.ulysses_parallel_size=1", "training.train_iters=4",
            "training.log_sample_ids=true", "training.save=null", f"training.log_dir={log_dir}"]  # fmt: skip
    main_forked(wan22_main, args, 1)
    return [json.loads(line) for line in (log_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_caption_folder_trains_the_losses_of_a_metadata_file_of_the_same_clips(tmp_path, main_forked):
    tiny = make_tiny(tmp_path / "tiny")
    folder, metadata = caption_folder_and_metadata(tiny)
    from_folder = train(main_forked, tiny, folder, tmp_path / "folder_run")
    from_file = train(main_forked, tiny, metadata, tmp_path / "file_run")
    assert [r["step"] for r in from_folder] == [1, 2, 3, 4]
    assert [r["sample_ids"] for r in from_folder] == [r["sample_ids"] for r in from_file]
    assert [r["loss"] for r in from_folder] == [r["loss"] for r in from_file]
