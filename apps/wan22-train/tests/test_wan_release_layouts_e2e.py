"""The official Wan2.2 release folders as downloaded, end to end, against the same weights in the
``-Diffusers`` layout.

A tiny ``-Diffusers`` root (``make_tiny`` + a second expert in ``transformer_2/``) is written again in the
exact official layout by the ``official_layout`` fixture: ``high_noise_model/`` + ``low_noise_model/``
(sharded ``diffusion_pytorch_model-*.safetensors`` + index + the official config.json), ``Wan2.1_VAE.pth``
and ``models_t5_umt5-xxl-enc-bf16.pth`` under the official key names, the ``google/umt5-xxl`` tokenizer
folder. Every sub-model's ``from_pretrained`` names the root; both runs train both experts at Ulysses 2
on 2 ranks and must log the same losses. The same for TI2V-5B's layout (the DiT at the root,
``Wan2.2_VAE.pth``), also at Ulysses 2 on 2 ranks.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from wan22_train.cli import main as wan22_main
from wan22_train.configs import config_path
from wan22_train.tiny import TINY_VAE, make_tiny, tiny_transformer

pytestmark = pytest.mark.slow

STEPS = 2
#: The tiny Wan2.2 (TI2V-5B-like) VAE: residual stages, 2x2 patchify, x8 in space, x2 in time.
TINY_WAN22_VAE = dict(
    base_dim=8, decoder_base_dim=8, z_dim=4, dim_mult=[1, 2, 2], num_res_blocks=1, temperal_downsample=[False, True],
    is_residual=True, patch_size=2, in_channels=12, out_channels=12, scale_factor_temporal=2, scale_factor_spatial=8,
)  # fmt: skip


def _yaml(value) -> str:
    return json.dumps(value)  # JSON is YAML: lists and numbers as the config reads them


def _shape_overrides(root: Path, vae: dict, subs: tuple[str, ...]) -> list[str]:
    """What the official files do not record about a tiny model (they hold the released shapes'
    weights only): the VAE's and UMT5's structure and the DiT's text_dim."""
    encoder = json.loads((root / "text_encoder" / "config.json").read_text())
    z = vae["z_dim"]
    keys = {**vae, "latents_mean": [0.0] * z, "latents_std": [1.0] * z}
    out = [f"model.models.ae.config.{k}={_yaml(v)}" for k, v in keys.items()]
    umt5 = (
        "vocab_size",
        "d_model",
        "d_kv",
        "d_ff",
        "num_layers",
        "num_heads",
        "relative_attention_num_buckets",
    )
    out += [f"model.models.text_encoder.config.{k}={encoder[k]}" for k in umt5]
    out += [f"model.models.{s}.config.text_dim=32" for s in subs]
    return out


def _run(main_forked, config: str, root: Path, save: Path, extra: list[str]) -> list[float]:
    subs = (
        ("ae", "text_encoder", "predictor", "predictor_low")
        if "both" in config
        else ("ae", "text_encoder", "predictor")
    )
    overrides = [
        *(f"model.models.{s}.from_pretrained={root}" for s in subs),
        "model.models.text_encoder.config.tokenizer=null",  # found in the root
        f"training.save={save}",
        f"training.train_iters={STEPS}",
        *extra,
    ]
    main_forked(wan22_main, ["--config", str(config_path(config)), *overrides], nproc=2)
    rows = [json.loads(line) for line in (save / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r]


@pytest.fixture(scope="module")
def t2v_roots(tmp_path_factory, official_layout):
    """(tiny -Diffusers root with two experts, the same weights in the official layout)."""
    base = tmp_path_factory.mktemp("release")
    diffusers_root = make_tiny(base / "Wan2.2-T2V-A14B-Diffusers")
    torch.manual_seed(1)
    low = tiny_transformer()
    with torch.no_grad():
        for p in low.parameters():
            p.add_(0.05 * torch.randn_like(p))
    low.save_pretrained(diffusers_root / "transformer_2")
    return diffusers_root, official_layout.write_release(diffusers_root, base / "Wan2.2-T2V-A14B")


def test_the_official_layout_is_what_the_release_ships(t2v_roots):
    official = t2v_roots[1]
    names = sorted(p.relative_to(official).as_posix() for p in official.rglob("*") if p.is_file())
    shards = [f"diffusion_pytorch_model-0000{n}-of-00002.safetensors" for n in (1, 2)]
    for expert in ("high_noise_model", "low_noise_model"):
        assert {
            f"{expert}/{f}"
            for f in [*shards, "config.json", "diffusion_pytorch_model.safetensors.index.json"]
        } <= set(names)
        assert "text_dim" not in json.loads(
            (official / expert / "config.json").read_text()
        )  # WanModel never stores it
    assert {"Wan2.1_VAE.pth", "models_t5_umt5-xxl-enc-bf16.pth", "google/umt5-xxl/tokenizer.json"} <= set(
        names
    )
    vae = torch.load(official / "Wan2.1_VAE.pth", weights_only=True)
    assert "decoder.upsamples.2.time_conv.weight" in vae and "encoder.middle.1.to_qkv.weight" in vae


def test_both_experts_train_from_the_official_release_as_from_the_diffusers_one(
    t2v_roots, tmp_path, main_forked
):
    diffusers_root, official = t2v_roots
    extra = [
        f"data.data_path={diffusers_root / 'data' / 'metadata.json'}",
        "model.models.predictor.config.expert=high_noise",
        "model.models.predictor_low.config.expert=low_noise",
        *_shape_overrides(diffusers_root, TINY_VAE, ("predictor", "predictor_low")),
    ]
    from_diffusers = _run(main_forked, "tiny_t2v_both.yaml", diffusers_root, tmp_path / "a", extra)
    from_official = _run(main_forked, "tiny_t2v_both.yaml", official, tmp_path / "b", extra)
    assert len(from_official) == STEPS and all(torch.isfinite(torch.tensor(from_official)))
    assert from_official == from_diffusers


def test_ti2v_5b_trains_from_its_official_release_as_from_the_diffusers_one(
    t2v_roots, tmp_path, main_forked, official_layout
):
    from diffusers import AutoencoderKLWan

    t2v = t2v_roots[0]
    root = tmp_path / "Wan2.2-TI2V-5B-Diffusers"
    root.mkdir()
    (root / "model_index.json").write_text("{}")
    torch.manual_seed(2)
    z = TINY_WAN22_VAE["z_dim"]
    vae = AutoencoderKLWan(**TINY_WAN22_VAE, latents_mean=[0.0] * z, latents_std=[1.0] * z)
    vae.save_pretrained(root / "vae")
    tiny_transformer(in_channels=z, out_channels=z).save_pretrained(root / "transformer")
    for part in ("text_encoder", "tokenizer"):
        (root / part).symlink_to(t2v / part, target_is_directory=True)
    official = official_layout.write_release(root, tmp_path / "Wan2.2-TI2V-5B", experts=False)
    assert (official / "Wan2.2_VAE.pth").is_file() and (official / "config.json").is_file()

    extra = [f"data.data_path={t2v / 'data' / 'metadata.json'}", "model.pipeline.task=ti2v",
             *_shape_overrides(root, TINY_WAN22_VAE, ("predictor",))]  # fmt: skip
    from_diffusers = _run(main_forked, "tiny_t2v.yaml", root, tmp_path / "a", extra)
    from_official = _run(main_forked, "tiny_t2v.yaml", official, tmp_path / "b", extra)
    assert len(from_official) == STEPS and from_official == from_diffusers
