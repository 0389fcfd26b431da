"""``data.dataset`` keys that did nothing on the trainer path are refused, saying where the setting is."""

from __future__ import annotations

import pytest
from mm_config import ConfigError, load_config


@pytest.mark.parametrize(
    ("key", "where"),
    [("max_text_length", "config.text_len"), ("return_first_frame", "model.pipeline.task: i2v or ti2v")],
)
def test_a_video_text_key_the_trainer_never_read_is_refused_with_where_it_went(tmp_path, key, where):
    path = tmp_path / "run.yaml"
    path.write_text(
        "data:\n  dataset_id: video_text\n  data_path: m.json\n"
        f"  dataset: {{num_frames: 9, height: 8, width: 8, {key}: 1}}\n"
    )
    with pytest.raises(ConfigError) as err:
        load_config(path, world_size=1, check_paths=False)
    assert f"data.dataset.{key}: unknown key; removed: " in str(err.value) and where in str(err.value)
