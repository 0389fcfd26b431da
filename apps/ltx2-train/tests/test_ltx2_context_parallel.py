"""LTX-2 under sequence parallelism (real gloo groups: Ulysses 2, Ring 2, USP 2 x 2) equals diffusers'
transformer on one process, forward and backward, for each release (2.0, 2.3, 2.5: gated attention,
prompt-modulated cross-attention, perturbed-attention processors, 2.5's fixed prompt table and bias-free
video feed-forward) and each mode's inputs: the app's forward (``LTX2Pipeline.predict`` on the
sequence-parallel predictor) against ``LTX2VideoTransformer3DModel`` given the inputs as diffusers' LTX-2
pipelines form them. One launch per layout checks every (release, mode). Ulysses 2 runs with the
all-to-alls overlapped with the q/k/v projections (``UlyssesOverlap(projections=True)``), USP 2 x 2
without (its default with a ring)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from ltx2_train.tiny import RELEASE_OPTIONS

pytestmark = pytest.mark.slow

RELEASES = sorted(RELEASE_OPTIONS)
#: ``t2av_conditioned``: audio on, sample 0's first latent frame given clean (per-token video timestep,
#: I2V / extension) and the audio at its own sigma (``audio_timesteps: independent``); ``t2v``: audio off
#: (placeholder audio tokens, modalities isolated), per-sample timestep; ``ic_lora``: IC-LoRA reference
#: video and audio tokens appended (timestep 0, their own RoPE positions) and audio extension (the first
#: :data:`CLEAN_AUDIO` audio frames clean: a per-token audio timestep).
MODES = ("t2av_conditioned", "t2v", "ic_lora")
REF_GRID, REF_AUDIO, CLEAN_AUDIO = (1, 4, 4), 3, 2
#: The releases each mode runs under: ``ic_lora`` under 2.3 alone (CI time; its prompt modulation and cross
#: timestep read per-sample sigmas beside the per-token timesteps the appended tokens extend).
MODE_RELEASES = {"t2av_conditioned": RELEASES, "t2v": RELEASES, "ic_lora": ["2.3"]}
SIGMA, AUDIO_SIGMA = torch.tensor([0.7, 0.03]), torch.tensor([0.4, 0.9])
PLACEHOLDER_TOKENS = 8  # LTX2Pipeline's audio_placeholder_tokens


def unused(name: str, mode: str) -> bool:
    """Whether parameter ``name`` is outside the forward of ``mode``: 2.5's keyframe embedding (no keyframe
    tokens) and, with the modalities isolated (``t2v``), the audio<->video cross-attention and its modulation."""
    cross_modal = ("audio_to_video_attn", "video_to_audio_attn", "a2v_cross_attn", "av_cross_attn")
    return "keyframes_abs_pos_embedding" in name or (mode == "t2v" and any(k in name for k in cross_modal))


def assert_close(got, want, name=""):
    """float32 agreement relative to the tensor's scale (reduction order differs across ranks)."""
    atol = 1e-5 * max(1.0, want.abs().max().item())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=atol, msg=lambda m: f"{name}: {m}")


def case(release: str, mode: str, transformer_inputs) -> SimpleNamespace:
    """The pipeline, its ``noised`` input and the diffusers forward's keywords of one (release, mode)."""
    from ltx2_train.pipeline import LTX2Pipeline
    from ltx2_train.tiny import TINY_TRANSFORMER

    x = transformer_inputs(config=TINY_TRANSFORMER | RELEASE_OPTIONS[release])
    audio = mode != "t2v"
    video_timestep = SIGMA  # per sample
    if mode == "t2av_conditioned":
        conditioned = torch.zeros(x["hidden_states"].shape[:2], dtype=torch.bool)
        conditioned[0, :16] = True  # sample 0's first latent frame (4 x 4 tokens)
        video_timestep = SIGMA[:, None] * (~conditioned)
    noised = {
        "noisy_video": x["hidden_states"], "noisy_audio": x["audio_hidden_states"] if audio else None,
        "grid": (x["num_frames"], x["height"], x["width"]), "text": x["encoder_hidden_states"],
        "audio_text": x["audio_encoder_hidden_states"], "text_mask": x["encoder_attention_mask"],
        "frame_rate": x["fps"], "sigma": SIGMA, "video_timestep": video_timestep,
        **({"audio_sigma": AUDIO_SIGMA} if audio else {}),
    }  # fmt: skip
    audio_sigma = AUDIO_SIGMA if audio else SIGMA
    audio_tokens = x["audio_hidden_states"] if audio else torch.zeros(2, PLACEHOLDER_TOKENS, 16)
    reference = {
        **x, "audio_hidden_states": audio_tokens, "audio_num_frames": audio_tokens.shape[1],
        "timestep": 1000 * video_timestep, "audio_timestep": 1000 * audio_sigma, "isolate_modalities": not audio,
    }  # fmt: skip
    if release != "2.0":  # diffusers' pipelines: sigma=timestep (per sample), audio_sigma, cross timestep
        reference |= {"sigma": 1000 * SIGMA, "audio_sigma": 1000 * audio_sigma, "use_cross_timestep": True}
    c = SimpleNamespace(pipeline=LTX2Pipeline(audio=audio), noised=noised, reference=reference, audio=audio,
                        lengths=(x["hidden_states"].shape[1], audio_tokens.shape[1]))  # fmt: skip
    return with_ic_lora_tokens(c, x) if mode == "ic_lora" else c


def with_ic_lora_tokens(c: SimpleNamespace, x: dict) -> SimpleNamespace:
    """``c`` with reference video and audio tokens (``noised["reference_*"]``) and the first ``CLEAN_AUDIO``
    audio frames clean; diffusers gets them as its IC-LoRA pipeline forms them: appended after the target,
    timestep 0, coordinates of their own shape from 0 (added by :func:`diffusers_forward_backward`)."""
    g = torch.Generator().manual_seed(7)
    ref_video = torch.randn(2, 16, x["hidden_states"].shape[2], generator=g)
    ref_audio = torch.randn(2, REF_AUDIO, x["audio_hidden_states"].shape[2], generator=g)
    audio_timestep = AUDIO_SIGMA[:, None].expand(-1, x["audio_hidden_states"].shape[1]).clone()
    audio_timestep[:, :CLEAN_AUDIO] = 0
    c.noised |= {"reference_video": ref_video, "reference_grid": REF_GRID, "reference_audio": ref_audio,
                 "audio_timestep": audio_timestep}  # fmt: skip
    video_len, audio_len = c.lengths
    c.reference |= {
        "hidden_states": torch.cat([x["hidden_states"], ref_video], dim=1),
        "audio_hidden_states": torch.cat([x["audio_hidden_states"], ref_audio], dim=1),
        "timestep": torch.cat([1000 * SIGMA[:, None].expand(-1, video_len), torch.zeros(2, 16)], dim=1),
        "audio_timestep": torch.cat([1000 * audio_timestep, torch.zeros(2, REF_AUDIO)], dim=1),
        "audio_num_frames": audio_len + REF_AUDIO,
    }
    c.ref_shapes = (REF_GRID, REF_AUDIO)
    return c


def block_input_lengths(model) -> list[tuple[int, int]]:
    """The (video, audio) token counts the first block of ``model`` sees, one entry per forward."""
    seen: list[tuple[int, int]] = []
    model.transformer_blocks[0].register_forward_pre_hook(
        lambda mod, args, kwargs: seen.append(
            (kwargs["hidden_states"].shape[1], kwargs["audio_hidden_states"].shape[1])
        ),
        with_kwargs=True,
    )
    return seen


def backward(model, video, audio, inputs):
    """Backward of a fixed linear loss; the outputs, the inputs' and the parameters' gradients."""
    loss = (video * torch.linspace(-1, 1, video.numel()).view_as(video)).sum()
    loss = loss + (audio * torch.linspace(1, -2, audio.numel()).view_as(audio)).sum()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return video.detach(), audio.detach(), [t.grad.clone() for t in inputs], grads


def app_forward_backward(model, c: SimpleNamespace):
    """``LTX2Pipeline.predict`` on ``model`` (the app's forward), then :func:`backward`."""
    keys = ["noisy_video", "text", "audio_text", *(["noisy_audio"] if c.audio else [])]
    noised = {**c.noised, **{k: c.noised[k].clone().requires_grad_(True) for k in keys}}
    model.zero_grad(set_to_none=True)
    video, audio = c.pipeline.predict(SimpleNamespace(model=model), noised)
    return backward(model, video, audio, [noised[k] for k in keys])


def diffusers_forward_backward(predictor, c: SimpleNamespace):
    """``LTX2VideoTransformer3DModel`` (the predictor's weights) on ``c.reference``, then :func:`backward`."""
    from diffusers import LTX2VideoTransformer3DModel

    model = LTX2VideoTransformer3DModel.from_config(predictor.config)
    model.load_state_dict(predictor.state_dict())
    keys = ["hidden_states", "encoder_hidden_states", "audio_encoder_hidden_states",
            *(["audio_hidden_states"] if c.audio else [])]  # fmt: skip
    inputs = {**c.reference, **{k: c.reference[k].clone().requires_grad_(True) for k in keys}}
    if hasattr(c, "ref_shapes"):  # IC-LoRA: each part's coordinates from 0, the target's then the reference's
        (ref_grid, ref_audio), (video_len, audio_len) = c.ref_shapes, c.lengths
        grid, fps = (
            (c.reference["num_frames"], c.reference["height"], c.reference["width"]),
            c.reference["fps"],
        )
        video_coords = [model.rope.prepare_video_coords(2, *g, "cpu", fps=fps) for g in (grid, ref_grid)]
        audio_coords = [model.audio_rope.prepare_audio_coords(2, n, "cpu") for n in (audio_len, ref_audio)]
        inputs |= {
            "video_coords": torch.cat(video_coords, dim=2),
            "audio_coords": torch.cat(audio_coords, dim=2),
        }
    video, audio = model(**inputs, return_dict=False)
    video_len, audio_len = c.lengths  # the target's outputs (a reference's are dropped, as the pipelines do)
    video, audio = video[:, :video_len], audio[:, :audio_len]
    video, audio, input_grads, grads = backward(model, video, audio, [inputs[k] for k in keys])
    target = {"hidden_states": video_len, "audio_hidden_states": audio_len}  # the target's tokens' gradients
    input_grads = [g[:, : target[k]] if k in target else g for k, g in zip(keys, input_grads, strict=True)]
    return video, audio, input_grads, grads


@pytest.fixture(scope="module")
def cases(ltx2_inputs) -> dict[tuple[str, str], SimpleNamespace]:
    """:func:`case` of every (release, mode)."""
    return {(r, m): case(r, m, ltx2_inputs) for m in MODES for r in MODE_RELEASES[m]}


@pytest.fixture(scope="module")
def diffusers_results(cases, tiny_predictor) -> dict[tuple[str, str], tuple]:
    """:func:`diffusers_forward_backward` of every case (checked to exercise every parameter in use)."""
    want = {key: diffusers_forward_backward(tiny_predictor(0, key[0]), c) for key, c in cases.items()}
    names = {r: {n for n, _ in tiny_predictor(0, r).named_parameters()} for r in RELEASES}
    for (release, mode), (_, _, _, grads) in want.items():
        assert names[release] - grads.keys() == {n for n in names[release] if unused(n, mode)}, (
            release,
            mode,
        )
    return want


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
def test_sequence_parallel_forward_and_backward_equal_diffusers_for_each_release_and_mode(
    distributed, cases, diffusers_results, tiny_predictor, world, ulysses, ring, local_lengths
):
    want = diffusers_results

    def body(rank, world_size):
        import torch.distributed as dist
        from mm_parallel import ParallelState, UlyssesOverlap

        overlap = UlyssesOverlap(projections=True) if ring == 1 else None
        state = ParallelState(world_size=world_size, ulysses=ulysses, ring=ring, ulysses_overlap=overlap)
        out = {}
        for release in RELEASES:
            model = tiny_predictor(0, release)
            model.setup_context_parallel(state)
            seen = block_input_lengths(model)
            for mode in (m for m in MODES if release in MODE_RELEASES[m]):
                video, audio, input_grads, grads = app_forward_backward(model, cases[release, mode])
                tensors = [*input_grads, *grads.values()]
                flat = torch.cat([t.flatten() for t in tensors])  # one all-reduce per case
                dist.all_reduce(flat, op=dist.ReduceOp.AVG, group=state.cp_group)
                for t, mean in zip(tensors, flat.split([t.numel() for t in tensors]), strict=True):
                    t.copy_(mean.view_as(t))
                out[release, mode] = (video, audio, input_grads, grads)
            assert seen[0] == local_lengths, seen
        return out

    for got in distributed(body, world):
        assert got.keys() == want.keys()
        for key, (video, audio, input_grads, grads) in got.items():
            ref_video, ref_audio, ref_input_grads, ref_grads = want[key]
            assert_close(video, ref_video, f"{key} video")
            assert_close(audio, ref_audio, f"{key} audio")
            for got_grad, want_grad in zip(input_grads, ref_input_grads, strict=True):
                assert_close(got_grad, want_grad, f"{key} input grad")
            assert grads.keys() == ref_grads.keys(), key
            for name, grad in grads.items():
                assert_close(grad, ref_grads[name], f"{key} {name}")
