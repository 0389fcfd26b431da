"""``wan22-train make-pairs``: Diffusion-DPO pairs from the tiny set's clips, ranked by a programmatic reward.

Every two clips of ``<tiny>/data/metadata.json`` with different scores under ``colour_target`` (how close
a clip's mean colour is to ``target``; ``mm_trainer.modes.rewards``) make a pair: the closer clip is
preferred. Each pair gives two rows, one per clip's caption with its colour word removed (``a circle
moving up``: a prompt that names no colour, so the preference is the reward's, not the prompt's). Every
``held_out_every``-th pair (both its rows) goes to ``held_out.json``, the others to ``train.json``, in
``<tiny>/pairs/`` (clip paths relative to it); files are written whole or not at all.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from itertools import combinations
from pathlib import Path

from mm_config import RewardConfig
from mm_data.synthetic import COLOURS
from mm_trainer import Rewards

from wan22_train.tiny import CLIP, load_clips

HELD_OUT_EVERY = 3


def colourless(caption: str) -> str:
    """``caption`` without its colour words (``a red circle moving up`` -> ``a circle moving up``)."""
    return " ".join(word for word in caption.split() if word not in COLOURS)


def make_colour_pairs(
    tiny: str | Path, target: Sequence[float], *, held_out_every: int = HELD_OUT_EVERY
) -> tuple[Path, Path]:
    """Write ``<tiny>/pairs/train.json`` and ``held_out.json`` (module docstring); return their paths."""
    tiny = Path(tiny)
    metadata = tiny / "data" / "metadata.json"
    rows = json.loads(metadata.read_text())
    reward = Rewards.from_config([RewardConfig(id="colour_target", options={"target": list(target)})])
    clips = load_clips(metadata, CLIP)
    captions = [colourless(row["cap"][0] if isinstance(row["cap"], list) else row["cap"]) for row in rows]
    scores = reward.score(captions, frames=clips, names=[row["path"] for row in rows]).total.tolist()
    train, held_out = [], []
    ranked = [(i, j) for i, j in combinations(range(len(rows)), 2) if abs(scores[i] - scores[j]) > 1e-6]
    for k, (i, j) in enumerate(ranked):
        better, worse = (i, j) if scores[i] > scores[j] else (j, i)
        pair = [
            {"caption": captions[c], "preferred": f"../data/{rows[better]['path']}", "rejected": f"../data/{rows[worse]['path']}"}
            for c in (i, j)
        ]  # fmt: skip
        (held_out if k % held_out_every == held_out_every - 1 else train).extend(pair)
    if not train or not held_out:
        raise ValueError(
            f"{metadata}: {len(ranked)} clip pairs differ in colour_target's score, too few for a training and a "
            f"held-out file (every {held_out_every}th pair is held out)"
        )
    out = tiny / "pairs"
    out.mkdir(parents=True, exist_ok=True)
    return _write(out / "train.json", train), _write(out / "held_out.json", held_out)


def _write(path: Path, rows: list[dict]) -> Path:
    part = path.with_suffix(".json.part")
    part.write_text(json.dumps(rows, indent=1))
    os.replace(part, path)
    return path
