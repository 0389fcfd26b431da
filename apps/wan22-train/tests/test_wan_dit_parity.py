"""WanDiT equals diffusers' WanTransformer3DModel with the same weights (fp32, CPU)."""

from __future__ import annotations

import json

import pytest
import torch
from diffusers import WanTransformer3DModel
from wan22_train.key_maps import native_to_diffusers
from wan22_train.model import load_wan_dit, save_wan_dit

ATOL = 1e-5


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def _rel_diff(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Max abs difference relative to the reference's largest magnitude (gradients are sums of many terms)."""
    return _max_diff(actual, expected) / max(expected.abs().max().item(), 1e-12)


@pytest.mark.parametrize("kind", ["t2v", "i2v", "ti2v"])
def test_forward_matches_diffusers(kind, diffusers_wan, wan_inputs):
    reference, folder = diffusers_wan(kind)
    model = load_wan_dit(folder).eval()
    inputs = wan_inputs(reference.config.in_channels)
    with torch.no_grad():
        expected = reference(*inputs, return_dict=False)[0]
        actual = model(*inputs)
    assert actual.shape == expected.shape == (2, reference.config.out_channels, *inputs[0].shape[2:])
    assert expected.abs().max() > 0.1  # a live signal, not a vanishing one
    assert _max_diff(actual, expected) < ATOL


@pytest.mark.parametrize("kind", ["t2v", "i2v"])
def test_input_and_weight_gradients_match_diffusers(kind, diffusers_wan, wan_inputs):
    reference, folder = diffusers_wan(kind)
    model = load_wan_dit(folder)
    hidden, timestep, text = wan_inputs(reference.config.in_channels)
    gen = torch.Generator().manual_seed(5)
    weights = torch.randn(2, reference.config.out_channels, *hidden.shape[2:], generator=gen)

    def grads(fn, module):
        h, c = hidden.clone().requires_grad_(), text.clone().requires_grad_()
        module.zero_grad()
        (fn(h, timestep, c) * weights).sum().backward()
        return h.grad, c.grad, {k: p.grad for k, p in module.named_parameters()}

    ref_h, ref_c, ref_params = grads(lambda *a: reference(*a, return_dict=False)[0], reference)
    our_h, our_c, our_params = grads(model, model)
    assert _rel_diff(our_h, ref_h) < ATOL
    assert _rel_diff(our_c, ref_c) < ATOL
    mapped = native_to_diffusers(our_params)
    assert mapped.keys() == ref_params.keys()
    # weight gradients sum over every token and pass q/k RMSNorm + softmax: fp32 rounding reaches ~2e-5
    worst = max((_rel_diff(mapped[k], ref_params[k]), k) for k in mapped)
    assert worst[0] < 1e-4, worst


def test_per_token_timestep_matches_diffusers(diffusers_wan, wan_inputs):
    """TI2V conditions the first frame by giving its tokens timestep 0: timestep is [B, tokens]."""
    reference, folder = diffusers_wan("ti2v")
    model = load_wan_dit(folder).eval()
    hidden, timestep, text = wan_inputs(48)
    tokens = (hidden.shape[2] // 1) * (hidden.shape[3] // 2) * (hidden.shape[4] // 2)
    per_token = timestep[:, None].expand(-1, tokens).clone()
    per_token[:, : tokens // hidden.shape[2]] = 0.0  # first latent frame is clean
    with torch.no_grad():
        expected = reference(hidden, per_token, text, return_dict=False)[0]
        actual = model(hidden, per_token, text)
        uniform = model(hidden, timestep, text)
    assert _max_diff(actual, expected) < ATOL
    assert _max_diff(actual, uniform) > 1e-3  # the per-token path really is different


def test_sharded_diffusers_folder_loads(diffusers_wan, wan_inputs):
    reference, folder = diffusers_wan("t2v", max_shard_size="40KB")
    assert (folder / "diffusion_pytorch_model.safetensors.index.json").is_file()
    model = load_wan_dit(folder).eval()
    inputs = wan_inputs(16)
    with torch.no_grad():
        assert _max_diff(model(*inputs), reference(*inputs, return_dict=False)[0]) < ATOL


@pytest.mark.parametrize("kind", ["t2v", "i2v"])
def test_export_to_diffusers_loads_in_diffusers_to_same_outputs(kind, diffusers_wan, wan_inputs, tmp_path):
    reference, folder = diffusers_wan(kind)
    model = load_wan_dit(folder).eval()
    save_wan_dit(model, tmp_path / "export", layout="diffusers")
    exported = WanTransformer3DModel.from_pretrained(tmp_path / "export").eval()
    inputs = wan_inputs(reference.config.in_channels)
    with torch.no_grad():
        assert (
            _max_diff(exported(*inputs, return_dict=False)[0], reference(*inputs, return_dict=False)[0])
            == 0.0
        )
    assert (
        json.loads((tmp_path / "export" / "config.json").read_text())["_class_name"]
        == "WanTransformer3DModel"
    )


def test_native_folder_round_trips(diffusers_wan, wan_inputs, tmp_path):
    _, folder = diffusers_wan("i2v")
    model = load_wan_dit(folder).eval()
    save_wan_dit(model, tmp_path / "native")
    config = json.loads((tmp_path / "native" / "config.json").read_text())
    assert config["dim"] == 64 and config["in_dim"] == 36 and config["model_type"] == "i2v"
    reloaded = load_wan_dit(tmp_path / "native").eval()
    inputs = wan_inputs(36)
    with torch.no_grad():
        assert torch.equal(reloaded(*inputs), model(*inputs))


def test_bf16_forward_tracks_diffusers_bf16(diffusers_wan, wan_inputs):
    reference, folder = diffusers_wan("t2v")
    model = load_wan_dit(folder, dtype=torch.bfloat16).eval()
    reference = reference.to(torch.bfloat16)
    hidden, timestep, text = wan_inputs(16)
    with torch.no_grad():
        expected = reference(hidden.bfloat16(), timestep, text.bfloat16(), return_dict=False)[0].float()
        actual = model(hidden.bfloat16(), timestep, text.bfloat16())
    assert actual.dtype == torch.bfloat16
    assert _max_diff(actual.float(), expected) < 0.05 * expected.abs().max().item()
