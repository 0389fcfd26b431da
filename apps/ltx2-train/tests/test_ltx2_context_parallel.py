"""LTX-2 transformer with Ulysses 2 (real gloo group) equals the one-process transformer, forward and backward."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytestmark = pytest.mark.slow


def forward_backward(model, inputs):
    for key in ("hidden_states", "audio_hidden_states", "encoder_hidden_states"):
        inputs[key].requires_grad_(True)
    video, audio = model(**inputs, return_dict=False)
    loss = (video * torch.linspace(-1, 1, video.numel()).view_as(video)).sum()
    loss = loss + (audio * torch.linspace(1, -2, audio.numel()).view_as(audio)).sum()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    input_grads = [
        inputs[k].grad.clone() for k in ("hidden_states", "audio_hidden_states", "encoder_hidden_states")
    ]
    return video.detach(), audio.detach(), input_grads, grads


def test_ulysses_2_forward_and_backward_equal_one_process_for_video_and_audio(
    distributed, tiny_predictor, ltx2_inputs
):
    build = tiny_predictor
    ref_video, ref_audio, ref_input_grads, ref_grads = forward_backward(build(), ltx2_inputs())
    assert len(ref_grads) == len(list(build().parameters()))

    def body(rank, world_size):
        import torch.distributed as dist
        from mm_parallel import ParallelState

        state = ParallelState(world_size=world_size, ulysses=2)
        model = build()
        model.setup_context_parallel(state)
        seen = []
        model.transformer_blocks[0].register_forward_pre_hook(
            lambda mod, args, kwargs: seen.append(
                (kwargs["hidden_states"].shape[1], kwargs["audio_hidden_states"].shape[1])
            ),
            with_kwargs=True,
        )
        video, audio, input_grads, grads = forward_backward(model, ltx2_inputs())
        # Each rank holds its tokens' share: 48 video tokens -> 24, 7 audio tokens padded to 8 -> 4.
        assert seen == [(24, 4)], seen
        for t in [*input_grads, *grads.values()]:
            dist.all_reduce(t, op=dist.ReduceOp.AVG, group=state.cp_group)
        return video, audio, input_grads, grads

    for video, audio, input_grads, grads in distributed(body, 2):
        torch.testing.assert_close(video, ref_video, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(audio, ref_audio, rtol=1e-5, atol=1e-5)
        for got, want in zip(input_grads, ref_input_grads, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert grads.keys() == ref_grads.keys()
        for name, grad in grads.items():
            torch.testing.assert_close(grad, ref_grads[name], rtol=1e-5, atol=1e-5, msg=name)


def test_ring_attention_is_refused_with_a_clear_error(tiny_predictor):
    model = tiny_predictor()
    state = SimpleNamespace(ring_size=2, ulysses_size=1)
    with pytest.raises(ValueError, match="ring_attention_size"):
        model.setup_context_parallel(state)
