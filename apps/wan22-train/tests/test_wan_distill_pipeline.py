"""``model.pipeline.distill`` (DMD2 around ``Wan22Pipeline``) on tiny predictors, in process: which
sub-model each phase trains, expert routing of every role with ``expert: both``, the student's schedule
(``student_sigma_max``, and the sigmas ``sample`` draws a distilled checkpoint on), and what is refused."""

from __future__ import annotations

import copy

import pytest
import torch
from mm_config import load_config
from mm_pipelines import SampleRNG
from wan22_train.configs import config_path
from wan22_train.container import Wan22Container
from wan22_train.distill import distillation_roles
from wan22_train.model import WanDiT, WanDiTConfig
from wan22_train.sampling import student_sigmas

SHAPE = (4, 1, 4, 4)
CONFIG = WanDiTConfig(
    patch_size=(1, 2, 2), in_dim=4, out_dim=4, dim=32, ffn_dim=64, num_heads=2, num_layers=1, text_dim=16,
    freq_dim=16, text_len=2, rope_max_seq_len=16,
)  # fmt: skip


def container(expert: str = "all", **distill) -> Wan22Container:
    torch.manual_seed(0)
    base = WanDiT(CONFIG)
    base.init_weights()
    models = {role: copy.deepcopy(base) for role in distillation_roles(expert)}
    trainable = tuple(role for role in models if not role.startswith("teacher"))
    for role in models:
        models[role].requires_grad_(role in trainable)
    pipeline = Wan22Container.build_pipeline({"expert": expert, "distill": distill})
    return Wan22Container(models, trainable=trainable, pipeline=pipeline)


def batch(size: int = 2) -> dict:
    g = torch.Generator().manual_seed(1)
    return {
        "latents": torch.randn(size, *SHAPE, generator=g),
        "prompt_embeds": torch.randn(size, 2, 16, generator=g),
    }


def rng(step: int = 0, size: int = 2) -> SampleRNG:
    return SampleRNG(seed=3, step=step, sample_ids=list(range(size)))


def grads(model: Wan22Container) -> set[str]:
    return {
        name
        for name, module in model.sub_models().items()
        if any(p.grad is not None for p in module.parameters())
    }


@pytest.mark.parametrize(("phase", "trained"), [("critic", {"critic"}), ("generator", {"predictor"})])
def test_each_phase_sends_gradients_to_its_own_sub_model_only(phase, trained):
    model = container()
    model(**batch(), rng=rng(), phase=phase).loss.backward()
    assert grads(model) == trained


def test_the_student_schedule_with_both_experts_routes_every_role_by_timestep():
    model = container("both")
    calls: list[str] = []
    for name, module in model.sub_models().items():
        module.register_forward_hook(lambda *_, name=name: calls.append(name))
    dmd = model.pipeline
    sigmas = dmd.student_sigmas()  # t2v recipe grid, shift 5: t = 1000, 938, 833, 625 -> 2 high, 2 low
    assert [round(float(s) * 1000) for s in sigmas[:-1]] == [1000, 938, 833, 625]
    dmd.sample(model, torch.randn(1, *SHAPE), {"prompt_embeds": torch.randn(1, 2, 16)})
    assert calls == ["predictor", "predictor", "predictor_low", "predictor_low"]
    calls.clear()
    dmd.sample(model, torch.randn(1, *SHAPE), {"prompt_embeds": torch.randn(1, 2, 16)}, role="teacher")
    assert calls == ["teacher", "teacher", "teacher_low", "teacher_low"]


def test_a_distillation_without_its_critic_is_refused_naming_it():
    model = container()
    models = dict(model.sub_models())
    del models["critic"]
    with pytest.raises(ValueError, match=r"add \['critic'\] under model.models"):
        Wan22Container(models, trainable=("predictor",), pipeline=model.pipeline)


def test_guidance_on_pre_encoded_prompts_needs_their_negative_embeddings():
    model = container(guidance_scale=3.0)
    with pytest.raises(KeyError, match="negative_prompt_embeds"):
        model(**batch(), rng=rng(), phase="generator")
    negative = {"negative_prompt_embeds": torch.zeros(2, 2, 16)}
    assert torch.isfinite(model(**batch(), **negative, rng=rng(), phase="generator").loss)


def test_a_call_without_a_phase_is_refused():
    with pytest.raises(ValueError, match="needs a phase in \\['critic', 'generator'\\]"):
        container()(**batch(), rng=rng())


def test_the_student_starts_at_student_sigma_max_from_that_share_of_the_noise():
    model = container(student_steps=1, student_sigma_max=0.5)
    dmd = model.pipeline
    assert dmd.student_sigmas().tolist() == [0.5, 0.0]
    noise, text = torch.randn(2, *SHAPE), {"prompt_embeds": torch.randn(2, 2, 16)}
    start = 0.5 * noise
    with torch.no_grad():
        v = model.predictor(start, torch.full((2,), 500.0), text["prompt_embeds"])
    torch.testing.assert_close(dmd.sample(model, noise, text), start - 0.5 * v)


def test_a_lower_student_sigma_max_keeps_the_grid_and_shift_of_the_student_schedule():
    top = container(student_steps=4, student_shift=3.0).pipeline.student_sigmas()
    lower = container(student_steps=4, student_shift=3.0, student_sigma_max=0.8).pipeline.student_sigmas()
    assert float(lower[0]) == pytest.approx(0.8) and lower[-1] == 0 and (lower[:-2] < top[:-2]).all()
    assert lower[-2] == top[-2]  # the same grid: its last point, at the same shift


@pytest.mark.parametrize("sigma_max", [0.0, 1.5])
def test_a_student_sigma_max_outside_0_to_1_is_refused(sigma_max):
    with pytest.raises(ValueError, match="student_sigma_max"):
        container(student_sigma_max=sigma_max)


def test_sample_draws_a_distilled_checkpoint_on_the_sigmas_its_student_trained_on():
    config = load_config(config_path("tiny_t2v_both_distill.yaml"), world_size=2)
    trained = Wan22Container.build_pipeline(config.model.pipeline).student_sigmas(4)
    assert torch.equal(student_sigmas(config, 4), trained)  # the recipe grid of both experts, shift 5
    assert [round(float(s) * 1000) for s in trained[:-1]] == [1000, 938, 833, 625]
    assert student_sigmas(load_config(config_path("tiny_t2v_both.yaml"), world_size=2), 4) is None
