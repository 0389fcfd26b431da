"""``mm-config check`` knows the Wan keys: pipeline options, sub-model configs, and the paths.

The schemas live in ``wan22_train.config_schema`` (no torch) and must agree with the code that
reads the keys: ``Wan22Pipeline.from_options``, ``WanDiTConfig``, ``UMT5Config`` and diffusers'
``AutoencoderKLWan``.
"""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys
from pathlib import Path

import pytest
from mm_config import ConfigError, load_config
from wan22_train.config_schema import (
    SCHEDULER_KEYS,
    UMT5EncoderConfig,
    WanPipelineOptions,
    WanPredictorConfig,
    WanVAEConfig,
)
from wan22_train.configs import config_path
from wan22_train.model import WanDiTConfig
from wan22_train.pipeline import Wan22Pipeline
from wan22_train.predictor import RELEASE_KEYS

TINY = config_path("tiny_t2v.yaml")


def tiny_inputs_without_the_predictor(root: Path) -> None:
    """The files tiny_t2v.yaml reads, under ``root``, except the predictor's weights folder."""
    for folder in ("vae", "text_encoder", "tokenizer", "data"):
        (root / "runs" / "tiny" / folder).mkdir(parents=True)
    (root / "runs" / "tiny" / "data" / "metadata.json").write_text("[]")


@pytest.mark.slow
def test_one_check_reports_a_pipeline_typo_a_bad_dataset_value_and_a_missing_path(tmp_path):
    tiny_inputs_without_the_predictor(tmp_path)
    proc = subprocess.run(
        [
            sys.executable, "-m", "mm_config", "check", str(TINY), "--world-size", "2",
            "model.pipeline.expret=high_noise", "data.dataset.num_frames=10",
        ],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    problems = [line.strip() for line in proc.stderr.splitlines() if line.startswith("  - ")]
    assert problems == [
        "- model.models.predictor.from_pretrained = 'runs/tiny/transformer': path not found "
        f"(relative to the working directory {tmp_path})",
        "- model.pipeline.expret: unknown key; did you mean `expert`?",
        "- data.dataset.num_frames = 10: violates frame_rule '4k+1'; the nearest valid values are 9 and 13",
    ], proc.stderr


@pytest.mark.parametrize(
    ("override", "path", "expected"),
    [
        ("model.pipeline.task=t3v", "model.pipeline.task", "expected 't2v', 'i2v' or 'ti2v'"),
        ("model.pipeline.boundary=0.5", "model.pipeline.boundary", "only with expert high_noise, low_noise"),
        ("model.pipeline.shift=0", "model.pipeline.shift", "expected greater than 0"),
        ("data.dataset.caption_dropout=2", "data.dataset.caption_dropout", "less than or equal to 1"),
        ("model.models.predictor.config.num_head=4", "model.models.predictor.config.num_head", "`num_heads`"),
        (
            "model.models.text_encoder.config.d_modle=8",
            "model.models.text_encoder.config.d_modle",
            "`d_model`",
        ),
        ("model.models.ae.config.z_dim=true", "model.models.ae.config.z_dim", "expected a valid integer"),
        ("model.models.predictor.load_format=dpc", "model.models.predictor.load_format", "'dcp'"),
    ],
)
def test_a_bad_wan_key_is_named_with_what_was_expected(override, path, expected):
    with pytest.raises(ConfigError) as info:
        load_config(TINY, [override], world_size=2)
    assert info.value.paths == [path], str(info.value)
    assert expected in str(info.value)


def test_ti2v_is_one_model_over_all_timesteps():
    with pytest.raises(
        ConfigError, match=r"model.pipeline.expert = 'high_noise': ti2v \(TI2V-5B\) is one model"
    ):
        load_config(TINY, ["model.pipeline.task=ti2v", "model.pipeline.expert=high_noise"], world_size=2)


def test_unset_pipeline_keys_stay_unset_so_the_expert_grid_applies():
    cfg = load_config(config_path("t2v_a14b_high.yaml"), world_size=8)
    assert cfg.model.pipeline == {"task": "t2v", "expert": "high_noise", "shift": 5.0, "sigma_min": 0.0,
                                  "extra_one_step": True}  # fmt: skip
    assert "num_layers" in cfg.model.models["predictor"].config
    assert "rope_theta" not in cfg.model.models["predictor"].config  # config.json's value stays


def test_pipeline_schema_keys_are_the_options_the_pipeline_reads():
    assert set(WanPipelineOptions.model_fields) == {
        "task",
        "expert",
        "boundary",
        "predict_dtype",
        "distill",
        "dpo",
        "grpo",
        "nft",
        *SCHEDULER_KEYS,
    }
    every_key = {"task": "t2v", "expert": "high_noise", "boundary": 0.4, "predict_dtype": "bf16",
                 "num_train_timesteps": 100, "shift": 5.0, "sigma_min": 0.0, "sigma_max": 1.0,
                 "extra_one_step": True, "weighting": False}  # fmt: skip
    wrappers = {
        "distill",
        "dpo",
        "grpo",
        "nft",
    }  # the container wraps the pipeline in their phases' pipelines
    assert every_key.keys() | wrappers == WanPipelineOptions.model_fields.keys()
    Wan22Pipeline.from_options(WanPipelineOptions.model_validate(every_key).model_dump(exclude=wrappers))


def test_distill_schema_keys_are_the_options_the_distillation_reads():
    from wan22_train.config_schema import DistillOptions
    from wan22_train.container import Wan22Container

    every_key = {"student_steps": 2, "student_shift": 1.0, "student_sigma_max": 0.5, "guidance_scale": 2.0,
                 "negative_prompt": "blur", "teacher_steps": 8, "dm_range": [0.1, 0.9],
                 "generator_loss": "flow_matching"}  # fmt: skip
    assert every_key.keys() == DistillOptions.model_fields.keys()
    options = WanPipelineOptions.model_validate({"expert": "both", "distill": every_key}).model_dump()
    dmd = Wan22Container.build_pipeline({k: v for k, v in options.items() if v is not None})
    assert (dmd.student_steps, dmd.student_shift, dmd.student_sigma_max, dmd.guidance_scale, dmd.negative_prompt,
            dmd.teacher_steps, dmd.dm_indices) == (2, 1.0, 0.5, 2.0, "blur", 8, (99, 899))  # fmt: skip
    assert dmd.generator_loss == "flow_matching" and dmd.base.expert == "both"


def test_dpo_schema_keys_are_the_options_diffusion_dpo_reads():
    from mm_pipelines import DiffusionDPO
    from wan22_train.config_schema import DPOOptions
    from wan22_train.container import Wan22Container

    every_key = {"beta": 123.0}
    assert every_key.keys() == DPOOptions.model_fields.keys()
    options = WanPipelineOptions.model_validate({"expert": "both", "dpo": every_key}).model_dump()
    dpo = Wan22Container.build_pipeline({k: v for k, v in options.items() if v is not None})
    assert isinstance(dpo, DiffusionDPO) and dpo.beta == 123.0 and dpo.base.expert == "both"


def test_distilling_one_a14b_expert_is_refused():
    with pytest.raises(ConfigError, match=r"model.pipeline.distill.*expected expert `all` or `both`"):
        load_config(TINY, ["model.pipeline.expert=high_noise", "model.pipeline.distill={}"], world_size=2)


def test_predictor_schema_is_wan_dit_config():
    fields = {f.name: f.default for f in dataclasses.fields(WanDiTConfig)}
    schema = {k: v for k, v in WanPredictorConfig.model_fields.items() if k not in RELEASE_KEYS}
    assert schema.keys() == fields.keys()
    for name, default in fields.items():
        expected = list(default) if isinstance(default, tuple) else default
        assert schema[name].default == expected, name


def test_text_encoder_and_vae_schemas_name_upstream_keywords():
    from diffusers import AutoencoderKLWan
    from transformers import UMT5Config

    umt5 = set(inspect.signature(UMT5Config.__init__).parameters)
    assert set(UMT5EncoderConfig.model_fields) - {"tokenizer", "text_len"} <= umt5
    vae = set(inspect.signature(AutoencoderKLWan.__init__).parameters) - {"self"}
    assert set(WanVAEConfig.model_fields) == vae


def test_the_schemas_load_without_torch():
    code = "import sys, wan22_train.config_schema; print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "False", proc.stderr


def test_the_cache_preprocess_section_is_refused_beside_several_sources():
    """It describes the one cache of ``data.data_path``; the sources' caches are preprocessed one by one."""
    sources = "data.sources=[{data_path: cache_a}, {data_path: cache_b, repeats: 2}]"
    with pytest.raises(ConfigError) as err:
        load_config(config_path("tiny_t2v_cached.yaml"), ["data.data_path=null", sources], world_size=2)
    assert [p.path for p in err.value.problems] == ["data.dataset.preprocess"]
    assert "describes the one cache of data.data_path" in str(err.value)
