"""A packed WanDiT forward (samples of different shapes in one sequence) equals each sample's own forward."""

from __future__ import annotations

import pytest
import torch

# three samples of different shapes (post-patch grids 3x4x6, 1x3x5, 2x2x3: 72, 15 and 12 tokens), each
# with its own timestep and a text of its own length
SHAPES = [(3, 8, 12), (1, 6, 10), (2, 4, 6)]
TIMESTEPS = [999.0, 312.5, 3.0]
TEXT_LENS = [7, 4, 9]
CP_CONFIG = dict(
    model_type="t2v", patch_size=(1, 2, 2), in_dim=16, dim=64, ffn_dim=96, freq_dim=32, text_dim=24,
    out_dim=16, num_heads=4, num_layers=2, qk_norm=True, cross_attn_norm=True, eps=1e-6, rope_max_seq_len=64,
)  # fmt: skip
FP32_SUMMED = ("modulation", "time_embedding", "time_projection", "norm3")


def packed_inputs(in_channels: int, text_dim: int, seed: int = 3):
    gen = torch.Generator().manual_seed(seed)
    latents = [torch.randn(in_channels, *fhw, generator=gen, dtype=torch.float64) for fhw in SHAPES]
    texts = [torch.randn(n, text_dim, generator=gen, dtype=torch.float64) for n in TEXT_LENS]
    return latents, torch.tensor(TIMESTEPS, dtype=torch.float64), texts


def test_packed_forward_equals_each_samples_own_forward_in_fp64(diffusers_wan):
    """Weights of a tiny real diffusers model; each sample alone through the same WanDiT is the reference
    (<= 1e-10), and diffusers' own forward of each sample agrees with it to the unpacked parity's 1e-5
    (WanDiT keeps diffusers' float32 RoPE tables and sinusoids, which fp64 diffusers computes in fp64)."""
    from wan22_train.model import load_wan_dit

    reference, folder = diffusers_wan("t2v")
    reference = reference.double()
    model = load_wan_dit(folder).double().eval()
    latents, timesteps, texts = packed_inputs(reference.config.in_channels, reference.config.text_dim)
    samples = list(zip(latents, timesteps, texts, strict=True))
    with torch.no_grad():
        packed = model(latents, timesteps, texts)
        alone = [model(z[None], t[None], c[None])[0] for z, t, c in samples]
        upstream = [reference(z[None], t[None], c[None], return_dict=False)[0][0] for z, t, c in samples]
        mixed = model(latents, timesteps.flip(0), texts)  # the timesteps reach their own samples
    assert [p.shape for p in packed] == [a.shape for a in alone] == [(16, *s) for s in SHAPES]
    for p, a, u in zip(packed, alone, upstream, strict=True):
        assert a.abs().max() > 0.1  # a live signal
        assert (p - a).abs().max().item() <= 1e-10
        assert (p - u).abs().max().item() <= 1e-5
    assert (mixed[0] - packed[0]).abs().max() > 1e-3


def test_packed_gradients_equal_the_sum_of_each_samples_gradients(diffusers_wan):
    """Input gradients and weight gradients <= 1e-10 (relative); those summed in float32 by the model
    (modulation, time embedding, norm3) <= 1e-6 (measured: up to 1.7e-7)."""
    from wan22_train.model import load_wan_dit

    _, folder = diffusers_wan("t2v")
    model = load_wan_dit(folder).double()
    latents, timesteps, texts = packed_inputs(16, 24)
    weights = [torch.linspace(-1, 1, z.numel(), dtype=torch.float64).view_as(z) for z in latents]

    def grads(outputs_of):
        model.zero_grad()
        inputs = [z.clone().requires_grad_() for z in latents]
        sum((out * w).sum() for out, w in zip(outputs_of(inputs), weights, strict=True)).backward()
        return [z.grad for z in inputs], {n: p.grad.clone() for n, p in model.named_parameters()}

    packed_dz, packed_dw = grads(lambda zs: model(zs, timesteps, texts))
    alone_dz, alone_dw = grads(
        lambda zs: [model(z[None], t[None], c[None])[0] for z, t, c in zip(zs, timesteps, texts, strict=True)]
    )
    for p, a in zip(packed_dz, alone_dz, strict=True):
        torch.testing.assert_close(p, a, rtol=0, atol=1e-10)
    for name, grad in alone_dw.items():
        # WanDiT sums the adaLN modulation and norm3 (LayerNorm) in float32 whatever the model's dtype:
        # their gradients are float32 sums over the tokens, in another order when packed
        rel = 1e-6 if any(part in name for part in FP32_SUMMED) else 1e-10
        assert (packed_dw[name] - grad).abs().max() <= rel * grad.abs().max(), name


def test_per_token_timesteps_of_one_sample_reach_its_tokens(diffusers_wan):
    """A TI2V-style sample (first latent frame at timestep 0) packed with plain samples."""
    from wan22_train.model import load_wan_dit

    reference, folder = diffusers_wan("t2v")
    model = load_wan_dit(folder).double().eval()
    latents, timesteps, texts = packed_inputs(16, 24)
    per_token = torch.full((72,), 999.0, dtype=torch.float64)
    per_token[:24] = 0.0  # sample 0's first latent frame (4 x 6 tokens) is clean
    with torch.no_grad():
        packed = model(latents, [per_token, timesteps[1], timesteps[2]], texts)
        alone = model(latents[0][None], per_token[None], texts[0][None])[0]
        uniform = model(latents, timesteps, texts)
    assert (packed[0] - alone).abs().max().item() <= 1e-10
    assert (packed[1] - uniform[1]).abs().max().item() <= 1e-10
    assert (packed[0] - uniform[0]).abs().max() > 1e-3


def test_a_latent_that_does_not_patch_is_refused_naming_the_sample(diffusers_wan):
    from wan22_train.model import load_wan_dit

    _, folder = diffusers_wan("t2v")
    model = load_wan_dit(folder).double()
    latents, timesteps, texts = packed_inputs(16, 24)
    latents[2] = latents[2][:, :, :3]
    with pytest.raises(ValueError, match=r"sample 2's latent F, H, W = \(2, 3, 6\)"):
        model(latents, timesteps, texts)


@pytest.mark.slow
@pytest.mark.parametrize(("ulysses", "ring"), [(2, 1), (1, 2), (2, 2)])
def test_packed_forward_and_backward_at_context_parallel_equal_one_process(distributed, ulysses, ring):
    """Ulysses 2, Ring 2 (zigzag: every sample split over the ring on its own) and USP 2 x 2 (4 ranks)."""

    def build():
        from wan22_train.model import WanDiTConfig
        from wan22_train.predictor import WanPredictor

        torch.manual_seed(0)
        model = WanPredictor(WanDiTConfig(**CP_CONFIG)).double()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.1 * torch.randn_like(p))
        return model

    def forward_backward(model):
        latents, timesteps, texts = packed_inputs(16, 24)
        latents = [z.requires_grad_() for z in latents]
        outputs = model(latents, timesteps, texts)
        sum(
            (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum() for out in outputs
        ).backward()
        grads = {n: p.grad for n, p in model.named_parameters()}
        return [o.detach() for o in outputs], [z.grad for z in latents], grads

    ref_out, ref_dz, ref_grads = forward_backward(build())

    def body(rank, world_size):
        import torch.distributed as dist
        from mm_parallel import ParallelState

        state = ParallelState(world_size=world_size, ulysses=ulysses, ring=ring)
        model = build()
        model.setup_context_parallel(state)
        seen = []
        model.blocks[0].register_forward_pre_hook(lambda mod, args: seen.append(args[0].shape[1]))
        out, dz, grads = forward_backward(model)
        for t in [*dz, *grads.values()]:  # each rank holds its tokens' share (see the unpacked CP test)
            dist.all_reduce(t, op=dist.ReduceOp.AVG, group=state.cp_group)
        return seen, out, dz, grads

    for seen, out, dz, grads in distributed(body, ulysses * ring):
        assert seen[0] < sum((f * h * w) // 4 for f, h, w in SHAPES)  # each rank held a share of the tokens
        for o, r in zip(out, ref_out, strict=True):
            torch.testing.assert_close(o, r, rtol=0, atol=1e-10)
        for d, r in zip(dz, ref_dz, strict=True):
            torch.testing.assert_close(d, r, rtol=0, atol=1e-10)
        for name, grad in grads.items():
            rel = 1e-6 if any(part in name for part in FP32_SUMMED) else 1e-10
            assert (grad - ref_grads[name]).abs().max() <= rel * ref_grads[name].abs().max(), name
