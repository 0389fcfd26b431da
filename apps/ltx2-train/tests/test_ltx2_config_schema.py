"""``mm-config check`` knows the LTX-2 keys; the schemas agree with the code that reads them."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest
from mm_config import ConfigError, load_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
TINY = CONFIGS / "tiny_t2av.yaml"


@pytest.mark.parametrize(
    ("override", "path", "expected"),
    [
        ("model.pipeline.timestep_sampling=normal", "model.pipeline.timestep_sampling", "'uniform'"),
        (
            "model.pipeline.first_frame_conditioning_p=1.5",
            "model.pipeline.first_frame_conditioning_p",
            "less than or equal to 1",
        ),
        ("model.pipeline.shift_max_tokens=1024", "model.pipeline.shift_max_tokens", "must differ"),
        ("model.pipeline.audoi=false", "model.pipeline.audoi", "did you mean `audio`?"),
        ("model.config.num_layer=2", "model.config.num_layer", "did you mean `num_layers`?"),
        ("model.config.num_layers=2.5", "model.config.num_layers", "expected a valid integer"),
        (
            "data.dataset.preprocess.frame_rule=4k+1",
            "data.dataset.preprocess.num_frames",
            "violates frame_rule",
        ),
        ("data.data_root=runs", "data.data_root", "ltx2_precomputed` reads no relative media paths"),
    ],
)
def test_a_bad_ltx2_key_is_named_with_what_was_expected(override, path, expected):
    with pytest.raises(ConfigError) as info:
        load_config(TINY, [override, "data.dataset.preprocess.num_frames=7"], world_size=2)
    assert info.value.paths == [path], str(info.value)
    assert expected in str(info.value)


def test_pipeline_schema_keys_are_the_options_the_pipeline_reads():
    from ltx2_train.config_schema import LTX2PipelineOptions
    from ltx2_train.pipeline import LTX2Pipeline

    every_key = {"timestep_sampling": "uniform", "sigma_std": 0.5, "shift_min_tokens": 10, "shift_min": 0.5,
                 "shift_max_tokens": 20, "shift_max": 1.0, "audio": False, "first_frame_conditioning_p": 0.5,
                 "audio_loss_weight": 0.5, "frame_rate": 30.0, "audio_placeholder_tokens": 4,
                 "audio_timesteps": "independent", "frozen_modality": "audio", "conditioning_frames": 2,
                 "reference": "video", "condition_modality": "none", "audio_conditioning_frames": 0}  # fmt: skip
    assert every_key.keys() == LTX2PipelineOptions.model_fields.keys()
    pipeline = LTX2Pipeline.from_options(LTX2PipelineOptions.model_validate(every_key).model_dump())
    assert (pipeline.sampler.mode, pipeline.sampler.max_tokens, pipeline.audio_placeholder_tokens) == (
        "uniform",
        20,
        4,
    )
    assert (pipeline.audio_timesteps, pipeline.frozen_modality) == ("independent", "audio")
    assert pipeline.conditioning_frames == 2 and pipeline.reference == "video"


@pytest.mark.parametrize(
    ("overrides", "path", "expected"),
    [
        (["model.pipeline.audio=false", "model.pipeline.frozen_modality=video"], "model.pipeline.frozen_modality",
         "audio-only training needs the audio stream"),
        (["model.pipeline.conditioning_frames=2"], "model.pipeline.conditioning_frames",
         "conditions no sample while first_frame_conditioning_p is 0"),
        (["model.pipeline.frozen_modality=both"], "model.pipeline.frozen_modality", "'none', 'audio' or 'video'"),
        (["model.pipeline.audio_timesteps=split"], "model.pipeline.audio_timesteps", "'shared' or 'independent'"),
        (["model.pipeline.condition_modality=video", "model.pipeline.audio_timesteps=independent"],
         "model.pipeline.audio_timesteps", "gives the conditioning stream timestep 0"),
        (["model.pipeline.reference=both"], "model.pipeline.reference", "'audio_video'"),
    ],
)  # fmt: skip
def test_a_bad_mode_key_is_named(overrides, path, expected):
    with pytest.raises(ConfigError) as info:
        load_config(TINY, overrides, world_size=2)
    assert info.value.paths == [path], str(info.value)
    assert expected in str(info.value)


@pytest.mark.parametrize("key", ["audio_timesteps=independent", "frozen_modality=audio"])
def test_a_distillation_refuses_the_modes_it_does_not_train(key):
    from ltx2_train.config_schema import LTX2ContainerPipelineOptions

    name, value = key.split("=")
    LTX2ContainerPipelineOptions.model_validate({name: value})  # without distill: accepted
    with pytest.raises(ValueError, match=f"(?s){name}.*a distillation .*: expected (shared|none)"):
        LTX2ContainerPipelineOptions.model_validate({name: value, "distill": {"shift": 3.0}})


def test_predictor_schema_names_every_transformer_keyword():
    from diffusers import LTX2VideoTransformer3DModel
    from ltx2_train.config_schema import LTX2PredictorConfig

    keywords = set(inspect.signature(LTX2VideoTransformer3DModel.__init__).parameters) - {"self"}
    assert set(LTX2PredictorConfig.model_fields) == keywords


def test_the_builder_refuses_data_root(tmp_path):
    from ltx2_train.data import ltx2_precomputed_dataset

    with pytest.raises(ValueError, match="ltx2_precomputed reads no media paths"):
        ltx2_precomputed_dataset(data_path=str(tmp_path), data_root=str(tmp_path))


def test_the_schemas_load_without_torch():
    code = "import sys, ltx2_train.config_schema; print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "False", proc.stderr


def test_the_preprocess_frame_offset_reaches_the_clip_reader_and_random_is_refused(tmp_path):
    from ltx2_train.preprocess import preprocess_options, source_dataset
    from mm_data import make_synthetic_dataset

    meta = make_synthetic_dataset(tmp_path, num_clips=1, sizes=[(16, 16)], num_frames=9)
    for value in ("start", "center"):
        overrides = [
            f"data.dataset.preprocess.source={meta}",
            f"data.dataset.preprocess.frame_offset={value}",
        ]
        config = load_config(TINY, overrides, world_size=2)
        assert source_dataset(preprocess_options(config)).frame_offset == value
    with pytest.raises(ConfigError, match="frame_offset"):
        load_config(TINY, ["data.dataset.preprocess.frame_offset=random"], world_size=2)
