"""LTX-2 few-step distillation (``ltx2_container`` with ``model.pipeline.distill``): DMD2 on the video and
audio streams together, its config keys, and sampling on the student's schedule."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from ltx2_train.container import LTX2Container
from ltx2_train.sampling import sampling_sigmas
from ltx2_train.tiny import TINY_TRANSFORMER
from mm_pipelines import SampleRNG

VIDEO_FHW, AUDIO_LEN, TEXT_LEN = (3, 4, 4), 7, 6  # 48 video tokens at patch 1; as tests/conftest.py's inputs

DISTILL = {"shift": 3.0, "student_steps": 2}
CONFIG = Path(__file__).resolve().parents[1] / "configs" / "tiny_t2av_distill.yaml"


def container(tiny_predictor, audio_loss_weight: float = 1.0, critic_seed: int = 1) -> LTX2Container:
    """A teacher, the student ``model`` (its copy) and a critic (another model unless ``critic_seed`` is 0)."""
    teacher = tiny_predictor(0).requires_grad_(False).eval()
    critic = copy.deepcopy(teacher) if critic_seed == 0 else tiny_predictor(critic_seed).requires_grad_(False)
    models = {"model": copy.deepcopy(teacher), "teacher": teacher, "critic": critic}
    for name in ("model", "critic"):
        models[name].requires_grad_(True)
    pipeline = LTX2Container.build_pipeline(
        {"audio": True, "audio_loss_weight": audio_loss_weight, "distill": DISTILL}
    )
    return LTX2Container(models, trainable=("model", "critic"), pipeline=pipeline)


def batch(size: int = 4) -> dict[str, torch.Tensor]:
    """Cached-latent inputs of the tiny transformer: video ``[B, 8, 3, 4, 4]``, audio ``[B, 4, 7, 4]``."""
    g = torch.Generator().manual_seed(3)
    return {
        "latents": torch.randn(size, 8, *VIDEO_FHW, generator=g),
        "audio_latents": torch.randn(size, 4, AUDIO_LEN, 4, generator=g),
        "prompt_embeds": torch.randn(size, TEXT_LEN, TINY_TRANSFORMER["caption_channels"], generator=g),
        "prompt_attention_mask": torch.ones(size, TEXT_LEN, dtype=torch.long),
        "frame_rate": torch.full((size,), 8.0),
    }


def keys(step: int = 0, ids: range = range(4)) -> SampleRNG:
    return SampleRNG(seed=7, step=step, sample_ids=list(ids))


def grads(module: torch.nn.Module) -> dict[str, torch.Tensor | None]:
    return {name: p.grad for name, p in module.named_parameters()}


def test_the_generator_phase_trains_the_student_on_video_and_audio_and_nothing_else(tiny_predictor):
    model = container(tiny_predictor)
    model(**batch(), rng=keys(), phase="generator").loss.backward()
    student = grads(model.model)
    assert student["proj_out.weight"].abs().sum() > 0 and student["audio_proj_out.weight"].abs().sum() > 0
    assert all(g is None for g in grads(model.critic).values())
    assert all(not p.requires_grad and p.grad is None for p in model.teacher.parameters())


def test_the_critic_phase_trains_the_critic_alone(tiny_predictor):
    model = container(tiny_predictor)
    model(**batch(), rng=keys(), phase="critic").loss.backward()
    critic = grads(model.critic)
    assert critic["proj_out.weight"].abs().sum() > 0 and critic["audio_proj_out.weight"].abs().sum() > 0
    assert all(g is None for g in grads(model.model).values())


def test_a_critic_that_is_the_teacher_gives_no_distribution_matching_gradient(tiny_predictor):
    # the fake score equals the real one, so the student's samples already match the teacher's distribution
    model = container(tiny_predictor, critic_seed=0)
    loss = model(**batch(), rng=keys(), phase="generator").loss
    loss.backward()
    assert loss.item() == 0.0
    assert all(g is None or not g.any() for g in grads(model.model).values())


def test_the_audio_term_weighs_as_audio_loss_weight(tiny_predictor):
    # the audio head reaches the loss only through the audio stream's term
    model = container(tiny_predictor, audio_loss_weight=0.0)
    model(**batch(), rng=keys(), phase="generator").loss.backward()
    student = grads(model.model)
    assert student["proj_out.weight"].abs().sum() > 0 and not student["audio_proj_out.weight"].any()


@pytest.mark.parametrize("phase", ["critic", "generator"])
def test_a_phase_loss_is_the_same_at_any_micro_batch_split(tiny_predictor, phase):
    model = container(tiny_predictor)
    whole = model(**batch(), rng=keys(step=3), phase=phase).loss
    inputs = batch()
    halves = [
        model(
            **{k: v[i : i + 2] for k, v in inputs.items()}, rng=keys(step=3, ids=range(i, i + 2)), phase=phase
        ).loss
        for i in (0, 2)
    ]
    torch.testing.assert_close(whole, (halves[0] + halves[1]) / 2, rtol=1e-5, atol=1e-6)


def test_a_distilled_run_samples_on_the_student_schedule_and_a_plain_run_on_the_shifted_grid(tiny_predictor):
    distillation = container(tiny_predictor).pipeline
    student = sampling_sigmas({"distillation": distillation, "pipeline": distillation.base}, 48, 4)
    torch.testing.assert_close(student, distillation.student_sigmas(4))
    plain = sampling_sigmas({"distillation": None, "pipeline": distillation.base}, 1024, 4)
    assert plain[0] == 1.0 and plain[-1] == 0.0 and len(plain) == 5
    assert not torch.equal(plain, student)


def test_the_distillation_config_validates_and_builds_its_three_roles():
    from mm_config import load_config

    config = load_config(CONFIG, world_size=2)
    assert config.model.container_id == "ltx2_container"
    assert set(config.model.sub_models()) == {"model", "teacher", "critic"}
    assert config.model.pipeline["distill"]["shift"] == 3.0


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.pipeline.distill.guidance_scale=3.0", r"distill.guidance_scale.*no negative ones"),
        ("model.pipeline.distill.negative_prompt=blur", r"distill.negative_prompt.*no text encoder"),
        ("model.pipeline.distill.teacher_steps=20", r"distill.teacher_steps.*no teacher reference"),
        ("model.pipeline.distill={student_steps: 4}", r"distill.shift"),
        ("model.pipeline.shift_max=3.0", r"model.pipeline.shift_max.*grid of distill.shift"),
        ("model.pipeline.first_frame_conditioning_p=0.5", r"first_frame_conditioning_p.*whole clips"),
    ],
)
def test_a_distillation_key_ltx2_cannot_use_is_refused(override, message):
    from mm_config import ConfigError, load_config

    with pytest.raises(ConfigError, match=message):
        load_config(CONFIG, [override], world_size=2)


def test_a_distillation_without_its_critic_is_refused(tiny_predictor):
    teacher = tiny_predictor(0).requires_grad_(False)
    pipeline = LTX2Container.build_pipeline({"audio": True, "distill": DISTILL})
    with pytest.raises(
        ValueError, match=r"needs the sub-models \['model', 'teacher', 'critic'\]: add \['critic'\]"
    ):
        LTX2Container(
            {"model": copy.deepcopy(teacher), "teacher": teacher}, trainable=("model",), pipeline=pipeline
        )


def test_the_tiny_distillation_reads_the_tiny_runs_cache():
    # so that one `preprocess` (of tiny_t2av.yaml, the tests' tiny cache) serves both READMEs' runs
    import yaml

    configs = Path(CONFIG).parent
    distill, tiny = (
        yaml.safe_load((configs / name).read_text()) for name in ("tiny_t2av_distill.yaml", "tiny_t2av.yaml")
    )
    assert distill["data"] == tiny["data"]


def test_distill_shift_sets_the_grid_of_the_timesteps_and_of_the_students_schedule():
    three, five = (LTX2Container.build_pipeline({"audio": True, "distill": {"shift": s}}) for s in (3.0, 5.0))
    assert (three.base.scheduler.shift, five.base.scheduler.shift) == (3.0, 5.0)
    assert (five.student_sigmas(4)[1:-1] > three.student_sigmas(4)[1:-1]).all()  # a larger shift: more noise


def test_a_student_or_critic_of_another_architecture_is_refused_naming_it_and_the_keys_before_it_is_built():
    """Only the config sections are read (the configs' weight folders do not exist here); the same shape
    passes, a critic with another ``num_attention_heads`` is named with the key and both values."""
    import json

    from mm_config import ConfigError, check_config, load_config
    from mm_trainer import ModelContainerHub

    shape = json.dumps({**TINY_TRANSFORMER, "vae_scale_factors": list(TINY_TRANSFORMER["vae_scale_factors"])})
    same = [f"model.models.{role}.config={shape}" for role in ("teacher", "model", "critic")]
    assert LTX2Container.sub_model_problems(load_config(CONFIG, same, world_size=2).model) == {}
    other = [*same, "model.models.critic.config.num_attention_heads=2"]
    with pytest.raises(ConfigError) as info:
        check_config(CONFIG, other, world_size=2, check_paths=False)
    assert info.value.paths == ["model.models.critic"], str(info.value)
    assert "num_attention_heads (critic: 2, teacher: 4)" in info.value.problems[0].message
    with pytest.raises(
        ValueError, match=r"model\.models\.critic: `critic` is not an architecture of its teacher"
    ):
        ModelContainerHub.build(load_config(CONFIG, other, world_size=2).model, device="cpu",
                                trainable=["model", "critic"], meta_init=False)  # fmt: skip
