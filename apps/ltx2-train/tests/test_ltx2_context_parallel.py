"""LTX-2 transformer under sequence parallelism (real gloo groups: Ulysses 2, Ring 2, USP 2 x 2) equals the
one-process transformer, forward and backward. Ulysses 2 runs with the all-to-alls overlapped with the
q/k/v projections (``UlyssesOverlap(projections=True)``), USP 2 x 2 without (its default with a ring)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.slow


def assert_close(got, want, name=""):
    """float32 agreement relative to the tensor's scale (reduction order differs across ranks)."""
    atol = 1e-5 * max(1.0, want.abs().max().item())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=atol, msg=lambda m: f"{name}: {m}")


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


@pytest.mark.parametrize(
    ("world", "ulysses", "ring", "local_lengths"),
    [
        # 48 video tokens -> 24 per rank; 7 audio tokens padded to 8 -> 4
        (2, 2, 1, (24, 4)),
        (2, 1, 2, (24, 4)),
        # 48 -> 12; 7 padded to 8 -> 2: all-to-all inside each ring rank, then the ring
        (4, 2, 2, (12, 2)),
    ],
    ids=["ulysses2", "ring2", "usp2x2"],
)
def test_sequence_parallel_forward_and_backward_equal_one_process_for_video_and_audio(
    distributed, tiny_predictor, ltx2_inputs, world, ulysses, ring, local_lengths
):
    build = tiny_predictor
    ref_video, ref_audio, ref_input_grads, ref_grads = forward_backward(build(), ltx2_inputs())
    assert len(ref_grads) == len(list(build().parameters()))

    def body(rank, world_size):
        import torch.distributed as dist
        from mm_parallel import ParallelState, UlyssesOverlap

        overlap = UlyssesOverlap(projections=True) if ring == 1 else None
        state = ParallelState(world_size=world_size, ulysses=ulysses, ring=ring, ulysses_overlap=overlap)
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
        assert seen == [local_lengths], seen
        for t in [*input_grads, *grads.values()]:
            dist.all_reduce(t, op=dist.ReduceOp.AVG, group=state.cp_group)
        return video, audio, input_grads, grads

    for video, audio, input_grads, grads in distributed(body, world):
        assert_close(video, ref_video, "video")
        assert_close(audio, ref_audio, "audio")
        for got, want in zip(input_grads, ref_input_grads, strict=True):
            assert_close(got, want, "input grad")
        assert grads.keys() == ref_grads.keys()
        for name, grad in grads.items():
            assert_close(grad, ref_grads[name], name)
