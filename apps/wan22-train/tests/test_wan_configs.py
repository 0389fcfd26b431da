"""Shipped configs: they validate, and --dry-run of the A14B expert shards 14B fp32 params over 8 ranks."""

from __future__ import annotations

import json

import pytest
from mm_config import ConfigError, load_config
from mm_parallel import explain_fsdp_plan
from mm_trainer import fsdp_plan_from_config
from mm_trainer.planner.dry_run import build_meta_model, dry_run
from wan22_train.configs import config_path

SHIPPED = [
    "tiny_t2v.yaml", "tiny_t2v_both.yaml", "tiny_t2v_lora.yaml", "tiny_t2v_cached.yaml", "t2v_a14b_high.yaml",
    "t2v_a14b_low.yaml", "t2v_a14b_both.yaml", "t2v_a14b_high_cached.yaml", "i2v_a14b.yaml", "ti2v_5b.yaml",
    "tiny_t2v_distill.yaml", "tiny_t2v_both_distill.yaml", "tiny_dpo.yaml", "tiny_grpo.yaml",
    "tiny_nft.yaml",
]  # fmt: skip


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_config_validates(name):
    world = 2 if name.startswith("tiny") else 8
    assert load_config(config_path(name), world_size=world).model.container_id == "wan2_2_container"


def test_dry_run_of_the_a14b_high_expert_puts_14b_fp32_params_over_8_ranks():
    cfg = load_config(config_path("t2v_a14b_high.yaml"), world_size=8)
    model = build_meta_model(cfg)
    assert all(p.is_meta for p in model.parameters())
    explanation = explain_fsdp_plan(model, fsdp_plan_from_config(cfg.parallel.fsdp_plan), 8)
    per_rank = explanation.sharded_bytes_by_owner()
    predictor_params = sum(p.numel() for p in model.predictor.parameters())
    assert predictor_params == pytest.approx(14.29e9, rel=0.005)
    assert per_rank["predictor"] == pytest.approx(predictor_params * 4 / 8, rel=0.001)
    text_encoder_params = sum(p.numel() for p in model.text_encoder.parameters())
    assert per_rank["text_encoder"] == pytest.approx(text_encoder_params * 2 / 8, rel=0.001)  # frozen bf16
    assert "ae" not in per_rank  # ignored: never sharded, kept whole on each rank


def test_dry_run_of_an_a14b_lora_puts_the_adapters_in_the_block_units_and_trains_only_them():
    # blocks 0-3 only: peft's injection costs ~10 ms a layer, and 4 blocks show the layout as well as 40
    targets = [
        "blocks.{0-3}.self_attn.?",
        "blocks.{0-3}.cross_attn.?",
        "blocks.{0-3}.ffn.0",
        "blocks.{0-3}.ffn.2",
    ]
    lora = json.dumps({"target_modules": targets, "rank": 32})
    cfg = load_config(
        config_path("t2v_a14b_high.yaml"), [f"model.models.predictor.lora={lora}"], world_size=8
    )
    model = build_meta_model(cfg)
    trainable = {n: p.numel() for n, p in model.predictor.named_parameters() if p.requires_grad}
    # per block: 8 attention projections 5120 -> 5120 and the FFN 5120 <-> 13824, each r * (in + out)
    per_block = 32 * (8 * (5120 + 5120) + 2 * (5120 + 13824))
    assert sum(trainable.values()) == 4 * per_block
    assert all(".lora_A.default." in n or ".lora_B.default." in n for n in trainable)
    assert {n.split(".")[1] for n in trainable} == {"0", "1", "2", "3"}
    explanation = explain_fsdp_plan(model, fsdp_plan_from_config(cfg.parallel.fsdp_plan), 8)
    block = next(u for u in explanation.units if u.path == "predictor.blocks.0")
    assert sum(n for k, n in trainable.items() if k.startswith("blocks.0.")) == per_block
    assert block.numel == sum(p.numel() for p in model.predictor.blocks[0].parameters())  # base + adapters


def test_dry_run_of_the_a14b_high_expert_from_the_encoder_cache_lists_no_vae_or_umt5_bytes():
    cfg = load_config(config_path("t2v_a14b_high_cached.yaml"), world_size=8)
    text = dry_run(cfg, world_size=8)  # what `wan22-train --config ... --dry-run --world-size 8` prints
    owners = {
        line.split(", ")[1].split(":")[0] for line in text.splitlines() if "sharded params per rank, " in line
    }
    assert owners == {"predictor"}
    assert "text_encoder" not in text and "ae." not in text
    assert "sharded params per rank, predictor: 6.7 GiB" in text  # 14.29e9 fp32 params / 8


def test_a_cache_of_random_frame_offsets_or_of_clip_level_caption_draws_is_refused_naming_the_keys():
    draws = ["data.dataset.preprocess.clips.frame_offset=random", "data.dataset.preprocess.clips.seed=3"]
    with pytest.raises(ConfigError) as err:
        load_config(config_path("t2v_a14b_high_cached.yaml"), draws, world_size=8)
    assert "data.dataset.preprocess.clips.frame_offset = 'random': a cache holds one window per clip" in str(
        err.value
    )
    assert "data.dataset.preprocess.clips.seed = 3: drawn at train time from the cache" in str(err.value)


def test_every_misspelt_id_and_a_pattern_typo_are_one_error_each_of_one_check(tiny_folder, tmp_path):
    from mm_config import check_config
    from wan22_train.tiny import tiny_overrides

    folder = tiny_folder
    typos = [
        "model.container_id=wan2_2_containr", "data.dataset_id=video_txt",
        "model.models.ae.model_id=wan_video_vea",  # a sub-model without a config section
        'features.recompute_plan.apply_modules=["predictor.blocks.{*}.atn"]',
    ]  # fmt: skip
    overrides = [*tiny_overrides(folder), f"training.save={tmp_path / 'ckpt'}", *typos]
    with pytest.raises(ConfigError) as info:
        check_config(config_path("tiny_t2v.yaml"), overrides, world_size=2)
    messages = {p.path: p.message for p in info.value.problems}
    assert sorted(messages) == [
        "data.dataset_id", "features.recompute_plan.apply_modules[0]", "model.container_id",
        "model.models.ae.model_id",
    ], str(info.value)  # fmt: skip
    assert "did you mean `wan2_2_container`?" in messages["model.container_id"]
    assert "did you mean `video_text`?" in messages["data.dataset_id"]
    assert "did you mean `wan_video_vae`?" in messages["model.models.ae.model_id"]
    assert (
        "segment `atn` matches no module under `predictor.blocks.{*}`"
        in messages["features.recompute_plan.apply_modules[0]"]
    )


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    from wan22_train.tiny import make_tiny

    return make_tiny(tmp_path_factory.mktemp("tiny"), num_clips=1)


@pytest.mark.parametrize("name", [n for n in SHIPPED if n.startswith("tiny")])
def test_shipped_tiny_configs_pass_the_model_checks(name, tiny_folder, tmp_path):
    from mm_config import check_config
    from wan22_train.tiny import tiny_cached_overrides, tiny_overrides

    folder = tiny_folder
    overrides = tiny_cached_overrides(folder, tmp_path) if "cached" in name else tiny_overrides(folder)
    if "both" in name:
        overrides.append(f"model.models.predictor_low.from_pretrained={folder / 'transformer'}")
    if "distill" in name:  # the teacher and the critic (and their low-noise twins) start from the same folder
        roles = ("teacher", "critic") + (("teacher_low", "critic_low") if "both" in name else ())
        overrides += [f"model.models.{role}.from_pretrained={folder / 'transformer'}" for role in roles]
    report = check_config(config_path(name), overrides, world_size=2, check_paths=False)
    assert [str(w) for w in report.warnings if "plan patterns" in str(w)] == []


def test_a_bf16_text_encoder_next_to_an_fp32_predictor_is_refused_unless_something_casts_its_output():
    """It passed the check and crashed at step 1 (bf16 text embeddings into the fp32 predictor); it runs
    (both accepted forms train on the tiny model) once param_dtype or the pipeline's predict_dtype casts."""
    bf16_encoder = ["model.models.text_encoder.dtype=bf16"]
    with pytest.raises(ConfigError) as info:
        load_config(config_path("tiny_t2v.yaml"), bf16_encoder, world_size=2)
    assert info.value.paths == ["model.models.text_encoder.dtype"], str(info.value)
    for cast in ("parallel.fsdp_plan.param_dtype=bf16", "model.pipeline.predict_dtype=fp32"):
        assert load_config(config_path("tiny_t2v.yaml"), [*bf16_encoder, cast], world_size=2)


def test_a_distillation_critic_of_another_architecture_is_refused_naming_it_and_the_keys_before_any_weight_is_read(
    tiny_folder, tmp_path
):
    """It used to train without a word; now ``mm-config check`` and the build refuse it, from config.json
    alone (the critic's weights are junk: reading them would fail differently)."""
    import shutil

    from mm_config import check_config
    from mm_trainer import ModelContainerHub
    from wan22_train.tiny import tiny_overrides

    other = shutil.copytree(tiny_folder / "transformer", tmp_path / "deeper")
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "num_layers": config["num_layers"] + 1}))
    for weights in other.glob("*.safetensors"):
        weights.write_bytes(b"junk: a check that read the weights would fail on it")
    overrides = [*tiny_overrides(tiny_folder), f"model.models.teacher.from_pretrained={tiny_folder / 'transformer'}",
                 f"model.models.critic.from_pretrained={other}"]  # fmt: skip
    with pytest.raises(ConfigError) as info:
        check_config(config_path("tiny_t2v_distill.yaml"), overrides, world_size=2, check_paths=False)
    assert info.value.paths == ["model.models.critic"], str(info.value)
    layers = config["num_layers"]
    want = f"`critic` is not an architecture of its teacher `teacher`: num_layers (critic: {layers + 1}, teacher: {layers})"
    assert want in info.value.problems[0].message
    model = load_config(config_path("tiny_t2v_distill.yaml"), overrides, world_size=2).model
    with pytest.raises(
        ValueError, match=r"model\.models\.critic: `critic` is not an architecture of its teacher"
    ):
        ModelContainerHub.build(model, device="cpu", trainable=["predictor", "critic"], meta_init=False)
