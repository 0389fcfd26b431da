"""One LoRA run of both A14B experts (``expert: both``, 2 gloo ranks, Ulysses 2) exports the pair users
look for: ``high_noise_model`` and ``low_noise_model``, each from its own expert's adapters.

The diffusers pair loaded into a tiny ``WanPipeline`` with both transformers (``load_lora_weights`` for
``transformer``, ``load_into_transformer_2=True`` for ``transformer_2``) computes each trained expert's
output (the sampling loader's: base from its source, adapters from the checkpoint); the ComfyUI pair,
read by diffusers' own converter of that layout, holds the same updates."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from wan22_train.cli import main as wan22_main
from wan22_train.configs import config_path
from wan22_train.tiny import make_tiny, tiny_overrides

pytestmark = pytest.mark.slow

STEPS = 8  # the step keys of seed 1234 route steps to both experts (checked below)
TARGETS = '["blocks.{*}.self_attn.?", "blocks.{*}.cross_attn.?", "blocks.{*}.ffn.0", "blocks.{*}.ffn.2"]'


def _inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(1, 4, 3, 8, 8, generator=g), torch.tensor([900.0]), torch.randn(1, 7, 32, generator=g)


def _updates(
    state: dict[str, torch.Tensor], down: str, up: str, scale: dict[str, float] | None = None
) -> dict:
    """``{layer: scale * up @ down}`` of a LoRA state dict."""
    out = {}
    for key, a in state.items():
        if key.endswith(f".{down}.weight"):
            layer = key.removesuffix(f".{down}.weight")
            out[layer] = (state[f"{layer}.{up}.weight"].double() @ a.double()) * (scale or {}).get(layer, 1.0)
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory, main_forked):
    tiny = make_tiny(tmp_path_factory.mktemp("lora_pair") / "tiny")
    lora = [f"model.models.{s}.lora.{k}={v}" for s in ("predictor", "predictor_low")
            for k, v in (("target_modules", TARGETS), ("rank", 4), ("alpha", 8))]  # fmt: skip
    overrides = [
        *tiny_overrides(tiny),
        f"model.models.predictor_low.from_pretrained={tiny / 'transformer'}",
        *lora,
        f"training.save={tiny / 'ckpt'}",
        f"training.train_iters={STEPS}",
        "training.lr=5e-2",
    ]
    main_forked(wan22_main, ["--config", str(config_path("tiny_t2v_both.yaml")), *overrides], nproc=2)
    return tiny


def test_a_two_expert_lora_run_exports_the_pair_and_diffusers_loads_each_into_its_transformer(run, tmp_path):
    from diffusers import (
        AutoencoderKLWan,
        FlowMatchEulerDiscreteScheduler,
        WanPipeline,
        WanTransformer3DModel,
    )
    from mm_trainer import load_run_config
    from transformers import AutoTokenizer, UMT5EncoderModel
    from wan22_train.sampling import load_for_sampling

    ckpt = run / "ckpt"
    assert (
        wan22_main(["export", "--checkpoint", str(ckpt), "--lora", "peft", "--out", str(tmp_path / "peft")])
        == 0
    )
    assert (
        wan22_main(
            ["export", "--checkpoint", str(ckpt), "--lora", "comfyui", "--out", str(tmp_path / "comfy")]
        )
        == 0
    )
    assert sorted(p.name for p in (tmp_path / "comfy").iterdir()) == [
        "high_noise_model.safetensors",
        "low_noise_model.safetensors",
    ]
    assert sorted(p.name for p in (tmp_path / "peft").iterdir()) == ["high_noise_model", "low_noise_model"]

    trained = load_for_sampling(load_run_config(ckpt), ckpt)
    pipe = WanPipeline(
        tokenizer=AutoTokenizer.from_pretrained(run / "tokenizer"),
        text_encoder=UMT5EncoderModel.from_pretrained(run / "text_encoder"),
        vae=AutoencoderKLWan.from_pretrained(run / "vae"),
        transformer=WanTransformer3DModel.from_pretrained(run / "transformer").eval(),
        transformer_2=WanTransformer3DModel.from_pretrained(run / "transformer").eval(),
        scheduler=FlowMatchEulerDiscreteScheduler(),
        boundary_ratio=0.875,
    )
    x, t, text = _inputs()
    with torch.no_grad():
        base = pipe.transformer(x, t, text, return_dict=False)[0]
    pipe.load_lora_weights(str(tmp_path / "peft" / "high_noise_model"))
    pipe.load_lora_weights(str(tmp_path / "peft" / "low_noise_model"), load_into_transformer_2=True)
    with torch.no_grad():
        outputs = {"predictor": pipe.transformer(x, t, text, return_dict=False)[0],
                   "predictor_low": pipe.transformer_2(x, t, text, return_dict=False)[0]}  # fmt: skip
        for name, out in outputs.items():
            torch.testing.assert_close(out, trained[name](x, t, text), rtol=1e-5, atol=1e-6)
            assert not torch.allclose(out, base, atol=1e-4), f"{name}: its adapters never trained"
    assert not torch.allclose(outputs["predictor"], outputs["predictor_low"], atol=1e-4)

    # The ComfyUI pair, through diffusers' converter of the non-diffusers Wan layout: the same updates.
    from diffusers.loaders.lora_conversion_utils import _convert_non_diffusers_wan_lora_to_diffusers

    for name in ("high_noise_model", "low_noise_model"):
        peft_file = tmp_path / "peft" / name / "pytorch_lora_weights.safetensors"
        peft = load_file(peft_file)
        from safetensors import safe_open

        with safe_open(str(peft_file), "pt") as f:
            meta = json.loads(f.metadata()["lora_adapter_metadata"])
        scale = meta["transformer.lora_alpha"] / meta["transformer.r"]
        expected = _updates(peft, "lora_A", "lora_B")
        converted = _convert_non_diffusers_wan_lora_to_diffusers(
            load_file(tmp_path / "comfy" / f"{name}.safetensors")
        )
        got = _updates(converted, "lora_A", "lora_B")
        assert got.keys() == expected.keys() and len(got) == 2 * 10
        for layer, update in got.items():
            torch.testing.assert_close(update, expected[layer] * scale, rtol=1e-6, atol=1e-9)
