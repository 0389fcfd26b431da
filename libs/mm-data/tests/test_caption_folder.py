"""A folder of clips with a same-named ``.txt`` caption each reads as a metadata file of the same clips."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from mm_data import (
    BadSampleError,
    MetadataError,
    VideoTextDataset,
    build_dataloader,
    check_samples,
    make_synthetic_dataset,
    read_metadata,
)

BUCKETS = [(32, 32, 9), (32, 48, 9), (48, 32, 9)]


def caption_folder(metadata: Path, out: Path, *, skip_caption: tuple[int, ...] = ()) -> Path:
    """The clips of a synthetic ``metadata`` file copied into ``out`` with their first caption beside each
    as ``<name>.txt`` (none for the rows in ``skip_caption``)."""
    out.mkdir(parents=True)
    for i, row in enumerate(json.loads(metadata.read_text())):
        clip = out / row["path"]
        shutil.copy(metadata.parent / row["path"], clip)
        if i not in skip_caption:
            clip.with_suffix(".txt").write_text(f"  {row['cap'][0]}\n")
    return out


def same_clips_as_metadata(folder: Path, out: Path) -> Path:
    """A metadata file naming the folder's clips in sorted order, each with its ``.txt`` caption."""
    rows = [{"path": str(p), "caption": p.with_suffix(".txt").read_text().strip()}
            for p in sorted(folder.glob("*")) if p.suffix in (".mp4", ".png")]  # fmt: skip
    out.write_text(json.dumps(rows))
    return out


def dataset(source: Path, **kwargs) -> VideoTextDataset:
    options = dict(
        num_frames=9, height=32, width=32, frame_stride=1, buckets=BUCKETS, seed=3, max_bad_fraction=0.5
    )
    return VideoTextDataset(source, **(options | kwargs))


def test_rows_are_the_clips_in_sorted_order_with_their_stripped_captions(tmp_path: Path):
    folder = tmp_path / "clips"
    (folder / "b").mkdir(parents=True)
    (folder / ".cache").mkdir()
    for name in ("z.mp4", "a.MP4", "b/c.png", ".hidden.mp4", ".cache/d.mp4", "notes.txt", "e.json"):
        (folder / name).write_bytes(b"")
    for name in ("z.txt", "a.txt", "b/c.txt"):
        (folder / name).write_text(f"\ufeff caption of {name}\n\n")
    rows = read_metadata(folder)
    assert [r["path"] for r in rows] == [str(folder / n) for n in ("a.MP4", "b/c.png", "z.mp4")]
    assert [r["caption"] for r in rows] == ["caption of a.txt", "caption of b/c.txt", "caption of z.txt"]
    assert not any("caption_error" in r for r in rows)


def test_a_folder_gives_the_items_buckets_and_order_of_a_metadata_file_of_the_same_clips(
    clips: Path, tmp_path: Path
):
    folder = caption_folder(clips, tmp_path / "clips")
    make_synthetic_dataset(tmp_path / "images", num_clips=0, num_images=1)
    (folder / "zz_image.png").write_bytes((tmp_path / "images" / "image_0000.png").read_bytes())
    (folder / "zz_image.txt").write_text("a magenta circle")
    from_folder = dataset(folder, caption_dropout=0.3)
    from_file = dataset(same_clips_as_metadata(folder, tmp_path / "same.json"), caption_dropout=0.3)
    assert len(from_folder) == len(from_file) == 9
    assert from_folder.buckets == from_file.buckets and from_folder.bucket_ids == from_file.bucket_ids
    for index in range(len(from_file)):
        a, b = from_folder[index], from_file[index]
        assert (a["index"], a["bucket"], a["prompt"], a["skipped"]) == (
            b["index"],
            b["bucket"],
            b["prompt"],
            b["skipped"],
        )
        assert torch.equal(a["video"], b["video"])
    orders = [build_dataloader(d, global_batch_size=2, micro_batch_size=1, dp_rank=0, dp_size=1, seed=5)
              for d in (from_folder, from_file)]  # fmt: skip
    assert [batch["index"].tolist() for batch in orders[0]] == [
        batch["index"].tolist() for batch in orders[1]
    ]


def test_a_clip_without_a_caption_is_a_bad_sample_named_with_its_caption_file(
    clips: Path, tmp_path: Path, caplog
):
    folder = caption_folder(clips, tmp_path / "clips", skip_caption=(0,))
    ds = dataset(folder)
    assert len(ds) == 8  # the clip is still a sample: the ids are the metadata file's
    with caplog.at_level(logging.WARNING, logger="mm_data"):
        item = ds[0]
    assert item["index"] != 0 and item["skipped"] == [0]
    [bad] = ds.bad_samples
    assert (
        bad.path == str(folder / "clip_0000.mp4") and bad.reason == "no caption file clip_0000.txt beside it"
    )
    assert "clip_0000.mp4" in caplog.text and "no caption file clip_0000.txt" in caplog.text


def test_empty_and_undecodable_captions_are_bad_samples_that_check_lists(clips: Path, tmp_path: Path):
    folder = caption_folder(clips, tmp_path / "clips")
    (folder / "clip_0001.txt").write_text(" \n")
    (folder / "clip_0002.txt").write_bytes(b"caf\xe9")
    reasons = {b.path.rsplit("/", 1)[1]: b.reason for b in check_samples(dataset(folder), workers=1)}
    assert reasons["clip_0001.mp4"] == "caption file clip_0001.txt is empty"
    assert reasons["clip_0002.mp4"].startswith("caption file clip_0002.txt is not UTF-8")
    assert {"clip_0006.mp4", "clip_0007.mp4"} <= reasons.keys()  # the corrupt and the too short clip


def test_a_folder_whose_uncaptioned_clips_pass_max_bad_fraction_is_refused_at_once(
    clips: Path, tmp_path: Path
):
    folder = caption_folder(clips, tmp_path / "clips", skip_caption=(0, 1, 2))
    with pytest.raises(
        BadSampleError, match=r"3 of 8 samples have no usable caption \(max_bad_fraction=0.25"
    ) as e:
        dataset(folder, max_bad_fraction=0.25)
    assert [b.index for b in e.value.bad] == [0, 1, 2] and "clip_0002.txt" in str(e.value)


@pytest.mark.parametrize("option", [{"data_root": "/data"}, {"columns": {"caption": "text"}}])
def test_metadata_options_are_refused_with_a_folder(clips: Path, tmp_path: Path, option):
    folder = caption_folder(clips, tmp_path / "clips")
    with pytest.raises(MetadataError, match=f"caption folder .*{next(iter(option))}=.*remove it"):
        dataset(folder, **option)


def test_a_folder_without_clips_is_refused(tmp_path: Path):
    (tmp_path / "clip.txt").write_text("a caption without its clip")
    with pytest.raises(MetadataError, match="holds no clip or image"):
        read_metadata(tmp_path)


def test_probed_clip_facts_are_kept_hidden_inside_the_folder(clips: Path, tmp_path: Path):
    folder = caption_folder(clips, tmp_path / "clips")
    first = dataset(folder)
    assert (folder / ".clips.json").is_file()
    assert dataset(folder).bucket_ids == first.bucket_ids and len(dataset(folder)) == 8
