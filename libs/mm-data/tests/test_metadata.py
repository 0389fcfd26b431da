import csv
import json
from pathlib import Path

import pytest
from mm_data import MetadataError, read_metadata

ROWS = [
    {
        "path": "a.mp4",
        "cap": ["one", "two"],
        "num_frames": 33,
        "fps": 16,
        "resolution": {"height": 48, "width": 80},
    },
    {
        "path": "/abs/b.mp4",
        "cap": "three",
        "num_frames": 17,
        "fps": 8,
        "resolution": {"height": 64, "width": 64},
    },
]


def test_json_list_rows_are_normalized_and_paths_resolved(tmp_path: Path):
    meta = tmp_path / "meta.json"
    meta.write_text(json.dumps(ROWS))
    rows = read_metadata(meta)
    assert rows[0]["path"] == str(tmp_path / "a.mp4")
    assert rows[1]["path"] == "/abs/b.mp4"
    assert rows[0]["caption"] == ["one", "two"] and rows[1]["caption"] == "three"
    assert (rows[0]["height"], rows[0]["width"], rows[0]["num_frames"], rows[0]["fps"]) == (48, 80, 33, 16.0)


def test_data_root_overrides_the_metadata_folder(tmp_path: Path):
    meta = tmp_path / "meta.jsonl"
    meta.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n")
    rows = read_metadata(meta, data_root="/data")
    assert [r["path"] for r in rows] == ["/data/a.mp4", "/abs/b.mp4"]


def test_csv_with_custom_column_names(tmp_path: Path):
    meta = tmp_path / "meta.csv"
    with meta.open("w", newline="") as f:
        writer = csv.DictWriter(f, ["video_file", "text", "height", "width", "extra"])
        writer.writeheader()
        writer.writerow({"video_file": "x.mp4", "text": "hello", "height": "32", "width": "48", "extra": "e"})
    (row,) = read_metadata(meta, columns={"path": "video_file", "caption": "text"})
    assert row["path"] == str(tmp_path / "x.mp4")
    assert (row["caption"], row["height"], row["width"], row["extra"]) == ("hello", 32, 48, "e")


def test_parquet_rows(tmp_path: Path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    meta = tmp_path / "meta.parquet"
    pq.write_table(pa.Table.from_pylist([{"file": "p.mp4", "prompt": "hi", "num_frames": 5}]), meta)
    (row,) = read_metadata(meta)
    assert (row["path"], row["caption"], row["num_frames"]) == (str(tmp_path / "p.mp4"), "hi", 5)


def test_missing_caption_names_file_and_row(tmp_path: Path):
    meta = tmp_path / "meta.json"
    meta.write_text(json.dumps([ROWS[0], {"path": "c.mp4"}]))
    with pytest.raises(MetadataError, match=r"meta\.json: row 1: missing required field 'caption'"):
        read_metadata(meta)


def test_non_numeric_field_is_reported(tmp_path: Path):
    meta = tmp_path / "meta.json"
    meta.write_text(json.dumps([{"path": "a.mp4", "cap": "x", "fps": "fast"}]))
    with pytest.raises(MetadataError, match=r"row 0: field 'fps' = 'fast' is not a number"):
        read_metadata(meta)


def test_unknown_format_is_rejected(tmp_path: Path):
    meta = tmp_path / "meta.txt"
    meta.write_text("x")
    with pytest.raises(MetadataError, match="unknown metadata format"):
        read_metadata(meta)
