"""``ltx2-train export --layout native``: the official LTX-2 single file of a trained transformer, which
diffusers' ``LTX2VideoTransformer3DModel.from_single_file`` loads into the same model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from diffusers import LTX2VideoTransformer3DModel
from diffusers.loaders.single_file_utils import convert_ltx2_transformer_to_diffusers
from ltx2_train.official import (
    METADATA_CONFIG,
    OFFICIAL_PREFIX,
    diffusers_transformer_config,
    official_transformer_config,
    read_single_file_config,
)
from ltx2_train.predictor import TRANSFORMER_DEFAULTS
from ltx2_train.tiny import RELEASE_OPTIONS, TINY_TRANSFORMER, one_token_patch
from ltx2_train.version import single_file_version
from safetensors import safe_open
from safetensors.torch import load_file
from torch import nn

README = "apps/ltx2-train/README.md"
ONE_TOKEN_TRANSFORMER = TINY_TRANSFORMER | one_token_patch()  # make-tiny's transformer
EXPORT_NATIVE = "ltx2-train export --checkpoint runs/ltx2_tiny/ckpt --layout native --out runs/ltx2_tiny/export/ltx2.safetensors"


def trained_checkpoint(tmp_path: Path, run_config, release: str = "2.0") -> tuple[Path, Path, nn.Module]:
    """A run config whose transformer folder is a tiny diffusers model of LTX-``release``, and a checkpoint of
    that run (as the trainer stores it: the transformer under ``model.``) holding other, "trained" weights."""
    from mm_checkpoint import DistributedCheckpointer

    model = LTX2VideoTransformer3DModel(**ONE_TOKEN_TRANSFORMER, **RELEASE_OPTIONS[release]).eval()
    model.save_pretrained(tmp_path / "transformer")
    with torch.no_grad():  # "trained": other weights than the folder's
        gen = torch.Generator().manual_seed(3)
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen))
    holder = nn.Module()
    holder.add_module("model", model)
    DistributedCheckpointer(tmp_path / "ckpt").save({"model": holder}, 4)
    return run_config(tmp_path), tmp_path / "ckpt", model


@pytest.fixture
def trained(tmp_path: Path, run_config) -> tuple[Path, Path, nn.Module]:
    """:func:`trained_checkpoint` of make-tiny's LTX-2.0 transformer."""
    return trained_checkpoint(tmp_path, run_config)


def test_native_export_is_the_official_single_file_that_from_single_file_loads(
    trained, tmp_path, one_token_inputs, readme
):
    from ltx2_train.cli import main

    config, ckpt, model = trained
    out = tmp_path / "ltx2.safetensors"
    paths = {"runs/ltx2_tiny/ckpt": ckpt, "runs/ltx2_tiny/export/ltx2.safetensors": out}
    assert main([*readme.command(README, EXPORT_NATIVE, paths=paths)[1:], "--config", str(config)]) == 0

    state = load_file(out)
    assert all(k.startswith(OFFICIAL_PREFIX) for k in state)
    assert "model.diffusion_model.patchify_proj.weight" in state
    assert "model.diffusion_model.transformer_blocks.0.attn1.q_norm.weight" in state
    # diffusers' own converter names every tensor as the model's key, none left over or missing
    assert sorted(convert_ltx2_transformer_to_diffusers(dict(state))) == sorted(model.state_dict())
    with safe_open(str(out), "pt") as f:
        section = json.loads(f.metadata()[METADATA_CONFIG])["transformer"]
    assert section["num_layers"] == ONE_TOKEN_TRANSFORMER["num_layers"]
    assert section["positional_embedding_max_pos"] == [20, 64, 64]

    loaded = LTX2VideoTransformer3DModel.from_single_file(
        str(out), config=str(tmp_path), subfolder="transformer", local_files_only=True
    ).eval()
    with torch.no_grad():
        want = model(**one_token_inputs(), return_dict=False)
        got = loaded(**one_token_inputs(), return_dict=False)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_the_metadata_gives_back_the_diffusers_arguments_it_records(trained, tmp_path):
    from ltx2_train.export import export_transformer
    from mm_config import load_config

    config, ckpt, _ = trained
    run = load_config(config, ["parallel.ulysses_parallel_size=1"], world_size=1)
    out = export_transformer(run, ckpt, tmp_path / "x.safetensors", layout="native")
    full = TRANSFORMER_DEFAULTS | ONE_TOKEN_TRANSFORMER
    recorded = read_single_file_config(out)
    assert recorded == {k: full[k] for k in diffusers_transformer_config(official_transformer_config(full))}
    assert recorded["num_attention_heads"] == ONE_TOKEN_TRANSFORMER["num_attention_heads"]
    assert recorded["base_height"] == ONE_TOKEN_TRANSFORMER["base_height"]


def test_a_native_ltx23_export_is_read_back_by_diffusers_converters_into_the_same_model(
    tmp_path, run_config, ltx2_inputs
):
    from diffusers.loaders.lora_conversion_utils import _convert_non_diffusers_ltx2_lora_to_diffusers
    from ltx2_train.export import export_transformer
    from ltx2_train.release_inputs import sigma_inputs
    from mm_config import load_config

    config, ckpt, model = trained_checkpoint(tmp_path, run_config, "2.3")
    run = load_config(config, ["parallel.ulysses_parallel_size=1"], world_size=1)
    out = export_transformer(run, ckpt, tmp_path / "ltx-2.3.safetensors", layout="native")
    with safe_open(str(out), "pt") as f:
        section = json.loads(f.metadata()[METADATA_CONFIG])["transformer"]
    assert {k: section[k] for k in ("apply_gated_attention", "cross_attention_adaln", "caption_proj_before_connector",
                                    "use_prompt_adaln_single", "ff_bias")} == {
        "apply_gated_attention": True, "cross_attention_adaln": True, "caption_proj_before_connector": True,
        "use_prompt_adaln_single": True, "ff_bias": True,
    }  # fmt: skip
    assert single_file_version(out) == "2.3"

    state = load_file(out)
    # diffusers 0.42.1's single-file converter leaves LTX-2.3's prompt AdaLN unnamed (so its from_single_file
    # cannot load a 2.3 file); its LTX-2 LoRA converter names them, and the whole file
    left = set(convert_ltx2_transformer_to_diffusers(dict(state))) - set(model.state_dict())
    assert left and all(k.startswith(("prompt_adaln_single.", "audio_prompt_adaln_single.")) for k in left)
    named = _convert_non_diffusers_ltx2_lora_to_diffusers(
        {k.removeprefix("model."): v for k, v in state.items()}
    )
    loaded = LTX2VideoTransformer3DModel(**ONE_TOKEN_TRANSFORMER, **RELEASE_OPTIONS["2.3"]).eval()
    loaded.load_state_dict({k.removeprefix("transformer."): v for k, v in named.items()}, strict=True)
    inputs = ltx2_inputs(config=ONE_TOKEN_TRANSFORMER | RELEASE_OPTIONS["2.3"])
    inputs.update(sigma_inputs("2.3", torch.tensor([700.0, 30.0]), inputs["audio_timestep"]))
    with torch.no_grad():
        want, got = model(**inputs, return_dict=False), loaded(**inputs, return_dict=False)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_the_official_metadata_refuses_what_ltx_core_cannot_express():
    with pytest.raises(ValueError, match=r"written for LTX-2.0 and 2.3 transformers; this one is LTX-2.5's"):
        official_transformer_config(TRANSFORMER_DEFAULTS | RELEASE_OPTIONS["2.5"])
    split = TRANSFORMER_DEFAULTS | RELEASE_OPTIONS["2.3"] | {"audio_gated_attn": False}
    with pytest.raises(
        ValueError, match=r"gated_attn=true, audio_gated_attn=false: .* \(apply_gated_attention\)"
    ):
        official_transformer_config(split)


def test_a_release_files_transformer_is_its_metadata_shape_and_its_keys_without_the_connectors(tmp_path):
    from types import SimpleNamespace

    from ltx2_train.official import TRANSFORMER_KEY_MAP
    from ltx2_train.predictor import transformer_config
    from mm_checkpoint import get_weight_transform
    from safetensors.torch import save_file

    release = tmp_path / "ltx-2-release.safetensors"
    save_file(
        {
            "model.diffusion_model.patchify_proj.weight": torch.zeros(2, 2),
            "model.diffusion_model.video_embeddings_connector.learnable_registers": torch.zeros(2),
            "vae.per_channel_statistics.mean-of-means": torch.zeros(2),
            "audio_vae.per_channel_statistics.mean-of-means": torch.zeros(2),
        },
        release,
        metadata={METADATA_CONFIG: json.dumps({"transformer": {"num_layers": 3}})},
    )
    args = SimpleNamespace(from_pretrained=str(release), checkpoint_path=None, config=None)
    assert transformer_config(args) == {"num_layers": 3}
    # what the predictor loads once mm-checkpoint's ComfyUI view took off the prefix and hid the VAEs
    plans = get_weight_transform(TRANSFORMER_KEY_MAP).plan_load(
        ["patchify_proj.weight", "video_embeddings_connector.learnable_registers"]
    )
    assert sorted(plans) == ["proj_in.weight"]


def test_layout_native_with_lora_is_refused_pointing_at_the_official_lora_file(trained, tmp_path):
    from ltx2_train.cli import main

    config, ckpt, _ = trained
    out = tmp_path / "x.safetensors"
    argv = ["export", "--checkpoint", str(ckpt), "--config", str(config), "--out", str(out)]
    with pytest.raises(ValueError, match="--layout native applies to a full transformer; .* --lora comfyui"):
        main([*argv, "--lora", "peft", "--layout", "native"])
    assert not out.exists()


def test_a_single_files_release_options_give_its_shape_and_release(tmp_path):
    from types import SimpleNamespace

    from ltx2_train.predictor import transformer_config, transformer_version
    from safetensors.torch import save_file

    official = {"num_layers": 2, "apply_gated_attention": True, "cross_attention_adaln": True}
    official["caption_proj_before_connector"] = True
    path = tmp_path / "ltx-2.3.safetensors"
    save_file(
        {"model.diffusion_model.patchify_proj.weight": torch.zeros(2, 2)},
        path,
        metadata={METADATA_CONFIG: json.dumps({"transformer": official}), "model_version": "2.3.0"},
    )
    args = SimpleNamespace(from_pretrained=str(path), checkpoint_path=None, config=None)
    shape = transformer_config(args)
    assert shape == {
        "num_layers": 2,
        "gated_attn": True,
        "audio_gated_attn": True,
        "cross_attn_mod": True,
        "audio_cross_attn_mod": True,
        "use_prompt_embeddings": False,
    }
    assert transformer_version(args) == ("2.3", str(path))
    args.config = {"gated_attn": False}
    with pytest.raises(
        ValueError, match=r"gated_attn=false \(the checkpoint's: true\) contradicts .*ltx-2.3"
    ):
        transformer_version(args)


def test_the_release_fields_written_are_those_the_release_is_read_from():
    from ltx2_train.official import RELEASE_FIELDS
    from ltx2_train.version import SINGLE_FILE_OPTIONS

    for field, (name, negated) in SINGLE_FILE_OPTIONS.items():
        assert RELEASE_FIELDS[field][0][0] == name and RELEASE_FIELDS[field][1] == negated, field
