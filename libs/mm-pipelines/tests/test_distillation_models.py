"""What a distillation asks of its sub-models before it is built: the roles, a frozen teacher, and a student
and critic of the teacher's architecture (named with every key that differs)."""

from __future__ import annotations

import pytest
from mm_pipelines import check_distillation_models, distillation_architecture_problems

TEACHER = {"model_id": "dit", "num_layers": 4, "dim": 64}


def test_a_student_or_critic_whose_architecture_differs_is_named_with_each_differing_key():
    architectures = {
        "teacher": TEACHER,
        "predictor": dict(TEACHER),
        "critic": {**TEACHER, "num_layers": 2, "dim": 32},
    }
    problems = distillation_architecture_problems(
        architectures, {"predictor": "teacher", "critic": "teacher"}
    )
    assert list(problems) == ["critic"]
    assert "dim (critic: 32, teacher: 64), num_layers (critic: 2, teacher: 4)" in problems["critic"]


def test_a_sub_model_whose_architecture_is_not_known_is_not_judged():
    problems = distillation_architecture_problems(
        {"teacher": None, "critic": {"model_id": "other"}}, {"critic": "teacher"}
    )
    assert problems == {}


def test_a_missing_role_or_a_trained_teacher_is_refused():
    with pytest.raises(ValueError, match=r"add \['critic'\]"):
        check_distillation_models(
            ["predictor", "teacher"], ["predictor"], ("predictor", "teacher", "critic"), ("teacher",)
        )
    with pytest.raises(ValueError, match="must be frozen"):
        check_distillation_models(
            ["predictor", "teacher"], ["teacher"], ("predictor", "teacher"), ("teacher",)
        )
