"""Frozen modality: the video and audio branches of the transformer, and a run that trains one of them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from ltx2_train.container import LTX2Container
from ltx2_train.modality import branch_parameters, freeze_branch, parameter_modality
from ltx2_train.pipeline import LTX2Pipeline
from ltx2_train.tiny import tiny_transformer
from mm_pipelines import SampleRNG
from mm_trainer.model.optim import build_optimizer

#: Every optional module of the 2.3-era transformer switched on, so that each has a branch.
ALL_OPTIONS = dict(
    gated_attn=True, cross_attn_mod=True, audio_gated_attn=True, audio_cross_attn_mod=True, perturbed_attn=True,
    use_prompt_adaln_single=True, use_keyframes_abs_pos_embedding=True,
)  # fmt: skip


def test_the_two_branches_split_every_parameter_of_the_transformer_with_every_option():
    model = tiny_transformer(**ALL_OPTIONS)
    video, audio = branch_parameters(model, "video"), branch_parameters(model, "audio")
    assert not set(video) & set(audio)
    assert set(video) | set(audio) == {name for name, _ in model.named_parameters()}
    assert "transformer_blocks.0.audio_to_video_attn.to_out.0.weight" in video  # writes the video stream
    assert "transformer_blocks.0.video_to_audio_attn.to_out.0.weight" in audio  # writes the audio stream
    assert "transformer_blocks.1.audio_attn1.to_gate_logits.weight" in audio
    assert "av_cross_attn_audio_v2a_gate.linear.weight" in audio and "proj_out.weight" in video


def test_a_parameter_of_an_unknown_module_is_refused_by_name():
    with pytest.raises(
        ValueError, match="'transformer_blocks.3.lyrics_attn.to_q.weight': its module 'lyrics_attn'"
    ):
        parameter_modality("transformer_blocks.3.lyrics_attn.to_q.weight")


def batch(size: int = 2) -> dict:
    g = torch.Generator().manual_seed(1)
    return {
        "latents": torch.randn(size, 8, 2, 4, 4, generator=g),
        "audio_latents": torch.randn(size, 4, 6, 4, generator=g),
        "prompt_embeds": torch.randn(size, 6, 32, generator=g),
        "prompt_attention_mask": torch.ones(size, 6, dtype=torch.long),
        "frame_rate": torch.full((size,), 8.0),
    }


def two_steps(container: LTX2Container) -> dict[str, torch.Tensor]:
    """Two AdamW steps of the trainer's optimizer (trainable parameters only) on one batch; the weights before."""
    before = {n: p.detach().clone() for n, p in container.model.named_parameters()}
    optimizer = build_optimizer(container, lr=1e-2)
    for step in range(2):
        out = container.pipeline.forward(
            container, SampleRNG(seed=0, step=step, sample_ids=[0, 1]), **batch()
        )
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
    return before


@pytest.mark.parametrize("frozen", ["audio", "video"])
def test_a_frozen_modality_trains_only_the_other_branch(tiny_predictor, frozen):
    model = tiny_predictor()
    pipeline = LTX2Pipeline.from_options({"audio": True, "frozen_modality": frozen})
    container = LTX2Container({"model": model}, trainable=("model",), pipeline=pipeline)
    trained = "video" if frozen == "audio" else "audio"
    assert container.frozen_branch == sorted(branch_parameters(model, frozen))
    in_optimizer = {
        id(p) for group in build_optimizer(container, lr=1.0).param_groups for p in group["params"]
    }
    assert in_optimizer == {id(p) for p in branch_parameters(model, trained).values()}
    before = two_steps(container)
    for name, param in model.named_parameters():
        if parameter_modality(name) == frozen:
            assert param.grad is None and torch.equal(param, before[name]), name
    unchanged = [n for n, p in branch_parameters(model, trained).items() if torch.equal(p, before[n])]
    assert not unchanged  # every parameter of the trained branch moved


def test_without_a_frozen_modality_both_branches_train(tiny_predictor):
    model = tiny_predictor()
    container = LTX2Container({"model": model}, trainable=("model",), pipeline=LTX2Pipeline.from_options({}))
    before = two_steps(container)
    for modality in ("video", "audio"):
        assert any(not torch.equal(p, before[n]) for n, p in branch_parameters(model, modality).items()), (
            modality
        )


def test_freeze_branch_returns_the_frozen_paths():
    model = tiny_transformer()
    frozen = freeze_branch(model, "audio")
    assert frozen and all(not dict(model.named_parameters())[n].requires_grad for n in frozen)
    assert all(p.requires_grad for p in branch_parameters(model, "video").values())


def test_a_lora_run_with_a_frozen_modality_is_refused_before_anything_is_built():
    section = SimpleNamespace(
        pipeline={"frozen_modality": "audio"},
        sub_models=lambda: {
            "model": SimpleNamespace(lora=SimpleNamespace(rank=4), model_id="ltx2_predictor")
        },
    )
    problems = LTX2Container.sub_model_problems(section)
    assert "frozen_modality=audio with LoRA" in problems["model"]
