"""The built-in dataset ids: their mm-config schemas agree with the datasets they build, and the
builders honour (or refuse) every ``data`` key."""

from __future__ import annotations

import inspect
import os
from typing import get_args

import pytest
from mm_checkpoint.formats import FORMAT_ALIASES
from mm_config import (
    DataConfig,
    LoadFormat,
    PrecomputedLatentsConfig,
    VideoPairsConfig,
    VideoTextDatasetConfig,
    frame_rule_problem,
)
from mm_data import PrecomputedLatentDataset, PreferencePairs, VideoTextDataset, check_frame_rule
from mm_data.precomputed import REQUIRED_KEYS
from mm_trainer import build_batch_stream, data_register
from mm_trainer.data.batches import precomputed_latents_dataset
from torch.utils.data import Dataset

NOT_FROM_YAML = {"tokenizer"}  # a callable: the pipeline tokenizes, YAML cannot name one
# keywords of the library's own use that the trainer never passes: refused in YAML (``removed_keys``)
NOT_ON_THE_TRAINER_PATH = {"max_text_length", "return_first_frame"}


def keyword_defaults(fn) -> dict:
    params = inspect.signature(fn).parameters.values()
    return {p.name: p.default for p in params if p.kind is p.KEYWORD_ONLY}


def test_video_text_schema_has_the_datasets_keywords_and_defaults():
    expected = keyword_defaults(VideoTextDataset.__init__)
    expected = {
        k: v for k, v in expected.items() if k not in NOT_FROM_YAML | NOT_ON_THE_TRAINER_PATH | {"data_root"}
    }
    fields = VideoTextDatasetConfig.model_fields
    assert fields.keys() == expected.keys()
    for name, default in expected.items():
        if default is inspect.Parameter.empty:
            assert fields[name].is_required(), name
        else:
            assert fields[name].default == default, name


def test_precomputed_schema_has_the_datasets_keywords_and_defaults():
    assert keyword_defaults(PrecomputedLatentDataset.__init__) == {"required": REQUIRED_KEYS}
    assert PrecomputedLatentsConfig.model_fields.keys() == {"required"}
    assert tuple(PrecomputedLatentsConfig.model_fields["required"].default) == REQUIRED_KEYS


def test_video_pairs_schema_has_the_datasets_keywords_and_defaults():
    expected = {k: v for k, v in keyword_defaults(PreferencePairs.__init__).items() if k != "data_root"}
    fields = VideoPairsConfig.model_fields
    assert fields.keys() == expected.keys()
    for name, default in expected.items():
        assert (
            fields[name].is_required()
            if default is inspect.Parameter.empty
            else fields[name].default == default
        )


@pytest.mark.parametrize("rule", ["4k+1", "8k+1", None])
def test_the_config_frame_rule_agrees_with_the_readers(rule):
    for n in range(1, 40):
        try:
            check_frame_rule(n, rule)
            reader_ok = True
        except ValueError:
            reader_ok = False
        assert (frame_rule_problem(n, rule) is None) == reader_ok, (n, rule)


def test_config_load_formats_are_mm_checkpoints_canonical_names():
    assert set(get_args(LoadFormat)) == set(FORMAT_ALIASES.values())


def test_precomputed_latents_builder_refuses_data_root(tmp_path):
    with pytest.raises(ValueError, match="data.data_root='clips': precomputed_latents reads no media paths"):
        precomputed_latents_dataset(data_path=str(tmp_path), data_root="clips")


@data_register("pid_probe")
class PidProbe(Dataset):
    """Two samples that say which process read them."""

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> dict:
        return {"pid": os.getpid(), "index": index}

    @staticmethod
    def collate_fn(items: list[dict]) -> dict:
        return {"pid": [it["pid"] for it in items]}


def readers_per_epoch(**data) -> list[set[int]]:
    stream = build_batch_stream(
        DataConfig(dataset_id="pid_probe", num_workers=1, **data),
        global_batch_size=2, micro_batch_size=2, dp_rank=0, dp_size=1, seed=0,
    )  # fmt: skip
    return [set(stream.next_batch()["pid"]) for _ in range(3)]  # one batch per epoch


def test_data_persistent_workers_keeps_the_same_worker_for_every_epoch():
    first, second, third = readers_per_epoch(persistent_workers=True)
    assert first == second == third != {os.getpid()}


def test_without_persistent_workers_every_epoch_has_a_new_worker():
    first, second, third = readers_per_epoch()
    assert len(first | second | third) == 3


@pytest.mark.parametrize("deadline", [0.5, None])
def test_data_dataset_decode_timeout_s_reaches_the_video_text_dataset(tmp_path, deadline):
    from mm_trainer.data.batches import build_dataset

    meta = tmp_path / "metadata.json"
    meta.write_text('[{"path": "clip.mp4", "caption": "a clip"}]')
    options = {"num_frames": 5, "height": 16, "width": 16, "decode_timeout_s": deadline}
    data = DataConfig(dataset_id="video_text", data_path=str(meta), dataset=options)
    assert build_dataset(data).decode_timeout_s == deadline
