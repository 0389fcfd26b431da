"""Preference pairs (Diffusion-DPO's offline data): per prompt a preferred and a rejected clip.

The pairs file is a JSON list of rows ``{"caption": str, "preferred": path, "rejected": path}``; relative
paths resolve against ``data_root`` (default: the file's folder). Every row and every file it names is
checked when the dataset is built, each problem naming the file, the row and the key. An item is
``{"prompt", "video", "rejected_video", "index"}``: both clips ``[3, num_frames, height, width]`` in
[-1, 1], from their first frame, every source frame (a clip too short or unreadable raises, naming it:
a pair is not replaced by another, as a bad clip of ``VideoTextDataset`` is).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from .dataset import to_video_tensor
from .decode import DecodeError, decode_frames, probe_video
from .frames import check_frame_rule, sample_frame_indices

PAIR_KEYS = ("caption", "preferred", "rejected")


class PreferencePairs(Dataset):
    """The pairs of ``pairs_path`` (module docstring), each clip read at ``num_frames`` x ``height`` x
    ``width``."""

    def __init__(
        self,
        pairs_path: str | Path,
        *,
        num_frames: int,
        height: int,
        width: int,
        data_root: str | Path | None = None,
        frame_rule: str | None = "4k+1",
    ) -> None:
        check_frame_rule(num_frames, frame_rule)
        self.metadata_path = str(pairs_path)
        self.num_frames, self.height, self.width = num_frames, height, width
        root = Path(data_root) if data_root is not None else Path(pairs_path).parent
        self.rows = read_pairs(pairs_path, root)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        row = self.rows[int(index)]
        return {
            "prompt": row["caption"],
            "video": self._clip(row["preferred"]),
            "rejected_video": self._clip(row["rejected"]),
            "index": int(index),
        }

    def _clip(self, path: Path) -> torch.Tensor:
        info = probe_video(path)
        try:
            indices = sample_frame_indices(info.num_frames, self.num_frames, 1.0, "start")
        except ValueError as e:
            raise DecodeError(f"{path}: {e} (a clip of {self.metadata_path})") from e
        return to_video_tensor(decode_frames(path, indices, self.height, self.width, info))


def read_pairs(pairs_path: str | Path, root: Path) -> list[dict[str, Any]]:
    """The rows of a pairs file, with the clips' paths resolved against ``root``; every problem (a row that is
    not ``{caption, preferred, rejected}``, a missing clip, a pair of one clip) raises, all of them listed."""
    try:
        rows = json.loads(Path(pairs_path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{pairs_path}: cannot read the pairs file: {e}") from e
    if not isinstance(rows, list) or not rows:
        raise ValueError(
            f"{pairs_path}: expected a non-empty JSON list of {{caption, preferred, rejected}} rows"
        )
    problems, out = [], []
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or sorted(row) != sorted(PAIR_KEYS):
            keys = sorted(row) if isinstance(row, dict) else type(row).__name__
            problems.append(f"row {i}: expected the keys {list(PAIR_KEYS)}, got {keys}")
            continue
        bad = [k for k in PAIR_KEYS if not isinstance(row[k], str) or not row[k]]
        if bad:
            problems.append(f"row {i}: {bad} must be non-empty strings")
            continue
        paths = {k: root / row[k] for k in ("preferred", "rejected")}
        problems += [f"row {i}: {k} {p} does not exist" for k, p in paths.items() if not p.is_file()]
        if paths["preferred"] == paths["rejected"]:
            problems.append(f"row {i}: preferred and rejected are the same clip {paths['preferred']}")
        out.append({"caption": row["caption"], **paths})
    if problems:
        raise ValueError(f"{pairs_path}: {len(problems)} bad pair row(s):\n  " + "\n  ".join(problems))
    return out


__all__ = ["PAIR_KEYS", "PreferencePairs", "read_pairs"]
