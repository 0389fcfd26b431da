"""WanDiT with Ulysses, Ring and USP (real gloo groups) equals the single-process model, forward and backward."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.slow

CONFIG = dict(
    model_type="t2v", patch_size=(1, 2, 2), in_dim=4, dim=64, ffn_dim=96, freq_dim=32, text_dim=24,
    out_dim=4, num_heads=4, num_layers=2, qk_norm=True, cross_attn_norm=True, eps=1e-6, rope_max_seq_len=64,
)  # fmt: skip


def build(seed: int = 0, fhw: tuple[int, int, int] = (2, 8, 12)):
    from wan22_train.model import WanDiTConfig
    from wan22_train.predictor import WanPredictor

    torch.manual_seed(seed)
    model = WanPredictor(WanDiTConfig(**CONFIG))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))  # nothing trivially zero (the head starts at zero in Wan)
    g = torch.Generator().manual_seed(seed + 1)
    inputs = (
        torch.randn(2, 4, *fhw, generator=g),  # (2, 8, 12): 2 x 4 x 6 = 48 tokens
        torch.tensor([700.0, 125.0]),
        torch.randn(2, 5, 24, generator=g),
    )
    return model, inputs


def forward_backward(model, inputs):
    hidden, timestep, text = (t.clone().requires_grad_(t.is_floating_point() and t.ndim > 1) for t in inputs)
    out = model(hidden, timestep, text)
    (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return out.detach(), hidden.grad.clone(), text.grad.clone(), grads


@pytest.mark.parametrize(
    ("world", "ulysses", "ring", "fhw"),
    [
        (2, 2, 1, (2, 8, 12)),
        (2, 1, 2, (2, 8, 12)),
        (4, 2, 2, (2, 8, 12)),
        (2, 2, 1, (1, 6, 10)),  # 15 tokens: padded to 16, padded keys masked
        (4, 2, 2, (1, 6, 10)),  # 15 tokens: padded to 16 for ring 2 (zigzag) x ulysses 2
    ],
)
def test_context_parallel_forward_and_backward_equal_one_process(distributed, world, ulysses, ring, fhw):
    model, inputs = build(fhw=fhw)
    ref_out, ref_dh, ref_dt, ref_grads = forward_backward(model, inputs)

    def body(rank, world_size):
        import torch.distributed as dist
        from mm_parallel import ParallelState

        state = ParallelState(world_size=world_size, ulysses=ulysses, ring=ring)
        cp_model, cp_inputs = build(fhw=fhw)
        cp_model.setup_context_parallel(state)
        seen = []
        cp_model.blocks[0].register_forward_pre_hook(lambda mod, args: seen.append(args[0].shape[1]))
        out, dh, dt, grads = forward_backward(cp_model, cp_inputs)
        tokens = fhw[0] * (fhw[1] // 2) * (fhw[2] // 2)
        local = -(-tokens // (2 * world_size)) * 2 if ring > 1 else -(-tokens // world_size)
        assert seen == [local], f"block 0 saw {seen} tokens; each rank should hold {local} of {tokens}"
        # Each rank holds its tokens' share of the gradient (scaled by the CP size): the CP mean is the
        # full gradient, which is what FSDP's gradient averaging over these ranks computes.
        for t in [dh, dt, *grads.values()]:
            dist.all_reduce(t, op=dist.ReduceOp.AVG, group=state.cp_group)
        return out, dh, dt, grads

    for out, dh, dt, grads in distributed(body, world):
        torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(dh, ref_dh, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(dt, ref_dt, rtol=1e-5, atol=1e-5)
        for name, grad in grads.items():
            torch.testing.assert_close(grad, ref_grads[name], rtol=1e-5, atol=1e-5, msg=name)
