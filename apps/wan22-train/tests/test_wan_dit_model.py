"""WanDiT module layout, input validation, and the context-parallel seam's contract."""

from __future__ import annotations

import pytest
import torch
from wan22_train.model import WanDiT, WanDiTConfig, load_wan_dit, save_wan_dit, sdpa_attention

TINY = WanDiTConfig(
    dim=64, num_heads=4, ffn_dim=96, text_dim=24, freq_dim=32, num_layers=2, rope_max_seq_len=64
)


def _inputs(batch: int = 1):
    return torch.randn(batch, 16, 3, 8, 12), torch.tensor([500.0] * batch), torch.randn(batch, 5, 24)


def test_native_parameter_layout():
    shapes = {k: tuple(v.shape) for k, v in WanDiT(TINY).state_dict().items()}
    assert shapes["patch_embedding.weight"] == (64, 16, 1, 2, 2)
    assert shapes["text_embedding.2.weight"] == (64, 64)
    assert shapes["time_projection.1.weight"] == (6 * 64, 64)
    assert shapes["blocks.1.self_attn.norm_q.weight"] == (64,)  # RMSNorm over all heads
    assert shapes["blocks.1.norm3.weight"] == (64,)  # cross-attention norm, affine
    assert shapes["blocks.1.ffn.0.weight"] == (96, 64)
    assert shapes["blocks.1.modulation"] == (1, 6, 64)
    assert shapes["head.modulation"] == (1, 2, 64)
    assert shapes["head.head.weight"] == (16 * 4, 64)
    assert not any(k.startswith(("blocks.0.norm1", "blocks.0.norm2", "head.norm")) for k in shapes)


def test_latents_not_divisible_by_patch_are_rejected():
    model = WanDiT(TINY)
    hidden, t, text = _inputs()
    with pytest.raises(ValueError, match="divisible by patch_size"):
        model(hidden[..., :7], t, text)


def test_per_token_timestep_with_wrong_length_is_rejected():
    model = WanDiT(TINY)
    hidden, _, text = _inputs()
    with pytest.raises(ValueError, match="72"):
        model(hidden, torch.zeros(1, 71), text)


def test_context_parallel_hooks_see_tokens_rope_and_head_output():
    """The seam's contract: what split/gather/attention receive (correctness under CP is tested with mm-parallel)."""
    model = WanDiT(TINY).eval()
    hidden, t, text = _inputs()
    calls: list[tuple[str, tuple[int, ...], int]] = []

    def split(x, dim):
        calls.append(("split", tuple(x.shape), dim))
        return x

    def gather(x, dim, size):
        calls.append(("gather", tuple(x.shape), dim))
        assert size == 72
        return x

    def attention(q, k, v):
        calls.append(("attention", tuple(q.shape), -1))
        return sdpa_attention(q, k, v)

    with torch.no_grad():
        expected = model(hidden, t, text)
        model.enable_context_parallel(split, gather, attention)
        assert model.context_parallel_enabled
        actual = model(hidden, t, text)
    assert torch.equal(actual, expected)
    assert calls == [
        ("split", (1, 72, 64), 1),
        ("split", (72, 1, 8), 0),
        ("split", (72, 1, 8), 0),
        ("attention", (1, 72, 4, 16), -1),
        ("attention", (1, 72, 4, 16), -1),
        ("gather", (1, 72, 64), 1),
    ]
    model.disable_context_parallel()
    assert not model.context_parallel_enabled and model.attention_fn is sdpa_attention


def test_per_token_timestep_embeddings_are_split_too():
    model = WanDiT(TINY).eval()
    hidden, _, text = _inputs()
    seen: list[tuple[int, ...]] = []
    model.enable_context_parallel(
        lambda x, dim: seen.append(tuple(x.shape)) or x, lambda x, dim, size: x, sdpa_attention
    )
    with torch.no_grad():
        model(hidden, torch.full((1, 72), 500.0), text)
    assert (1, 72, 64) in seen and (1, 72, 6, 64) in seen


def test_init_weights_materializes_a_meta_model_with_a_zero_head():
    with torch.device("meta"):
        model = WanDiT(TINY)
    model.to_empty(device="cpu")
    model.init_weights()
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert model.blocks[0].self_attn.norm_q.weight.eq(1).all()
    assert model(*_inputs()).abs().max() == 0  # Wan starts from a zero output projection


def test_load_wan_dit_names_missing_and_unexpected_weights(tmp_path):
    from safetensors.torch import load_file, save_file

    save_wan_dit(WanDiT(TINY), tmp_path)
    state = load_file(tmp_path / "diffusion_pytorch_model.safetensors")
    state["blocks.0.self_attn.qq.weight"] = state.pop("blocks.0.self_attn.q.weight")
    save_file(state, tmp_path / "diffusion_pytorch_model.safetensors")
    from mm_checkpoint import CheckpointLoadError

    with pytest.raises(
        CheckpointLoadError,
        match=r"(?s)missing: \['blocks\.0\.self_attn\.q\.weight'\].*unexpected: \['blocks\.0\.self_attn\.qq\.weight'\]",
    ):
        load_wan_dit(tmp_path)


def test_the_model_class_holds_no_weight_io():
    # weights on disk: wan22_train.model.weights; the trainer's from_pretrained(args) is WanPredictor's alone
    assert not {"from_pretrained", "save_pretrained"} & set(vars(WanDiT))
