"""IC-LoRA reference clips named in an LTX-2 source: refused before any encoder loads when they cannot pair
with their targets (each row, file and both values named), and part of each sample's cache key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mm_data import make_synthetic_dataset

REPO = Path(__file__).resolve().parents[3]
TINY = REPO / "apps" / "ltx2-train" / "configs" / "tiny_t2av_ic_lora.yaml"
CLIP = {"sizes": ((16, 16),), "seed": 0}


def source(tmp_path: Path, references: list[str | None]) -> Path:
    """Target clips (5 frames at 8 fps) whose rows name ``references`` (paths under ``tmp_path``); references:
    ``ok/`` (5 frames at 8 fps), ``long/`` (9 frames), ``fast/`` (12 fps)."""
    make_synthetic_dataset(tmp_path / "targets", num_clips=len(references), fps=8, num_frames=5, **CLIP)
    for name, fps, frames in (("ok", 8, 5), ("long", 8, 9), ("fast", 12, 5)):
        make_synthetic_dataset(tmp_path / name, num_clips=2, fps=fps, num_frames=frames, **CLIP)
    rows = json.loads((tmp_path / "targets" / "metadata.json").read_text())
    for row, reference in zip(rows, references, strict=True):
        row["path"] = f"targets/{row['path']}"
        if reference is not None:
            row["reference"] = reference
    metadata = tmp_path / "metadata.json"
    metadata.write_text(json.dumps(rows))
    return metadata


def config(tmp_path: Path, metadata: Path):
    """The IC-LoRA tiny config on ``metadata``, its model set a folder that does not exist (nothing may load)."""
    from mm_config import load_config

    return load_config(TINY, [f"data.dataset.preprocess.source={metadata}", f"data.data_path={tmp_path / 'cache'}",
                              f"data.dataset.preprocess.model_root={tmp_path / 'no_model_set'}",
                              "parallel.ulysses_parallel_size=1"], world_size=1)  # fmt: skip


def test_references_of_another_frame_count_or_rate_are_refused_naming_each_row_before_any_encoder_loads(
    tmp_path,
):
    from ltx2_train.preprocess import run_preprocess
    from mm_trainer import SampleFramesError

    metadata = source(tmp_path, ["ok/clip_0000.mp4", "long/clip_0000.mp4", "fast/clip_0001.mp4", "gone.mp4"])
    with pytest.raises(SampleFramesError) as error:
        run_preprocess(config(tmp_path, metadata))
    message = str(error.value)
    assert f"{metadata}: IC-LoRA reference clips (column 'reference') that cannot pair" in message
    assert "sample 0" not in message
    assert f"sample 1: reference {tmp_path / 'long/clip_0000.mp4'} has 9 frames where 5 are asked" in message
    fast = tmp_path / "fast/clip_0001.mp4"
    assert f"sample 2: reference {fast} runs at 12 fps where its target is at 8 fps" in message
    assert f"sample 3: reference {tmp_path / 'gone.mp4'} not found" in message


def test_a_source_where_only_some_rows_name_a_reference_is_refused_naming_the_others(tmp_path):
    from ltx2_train.preprocess import run_preprocess
    from mm_trainer import SampleFramesError

    metadata = source(tmp_path, ["ok/clip_0000.mp4", None])
    with pytest.raises(SampleFramesError, match=r"sample 1 \(.*targets/clip_0001.mp4\): names no reference"):
        run_preprocess(config(tmp_path, metadata))


def test_a_samples_cache_key_follows_its_references_content(tmp_path):
    from ltx2_train.preprocess import preprocess_options, source_dataset
    from ltx2_train.references import key_references
    from mm_data import clip_digests
    from mm_data.cache_plan import sample_keys

    metadata = source(tmp_path, ["ok/clip_0000.mp4", "ok/clip_0001.mp4"])
    options = preprocess_options(config(tmp_path, metadata))

    def keys() -> list[str | None]:
        dataset = source_dataset(options)
        key_references(dataset, options)
        records, _ = clip_digests([row["path"] for row in dataset.rows], metadata_path=None)
        return sample_keys(dataset, {}, records, uses_prompt=True)[0]

    before = keys()
    (tmp_path / "ok" / "clip_0001.mp4").write_bytes((tmp_path / "ok" / "clip_0000.mp4").read_bytes())
    after = keys()
    assert after[0] == before[0] and after[1] != before[1]
