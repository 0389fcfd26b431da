"""``model.models.<name>.lora``: what a LoRA section accepts and which combinations it refuses."""

from __future__ import annotations


def _with_lora(container, sub: str = "predictor", **lora):
    data = container()
    data["model"]["models"][sub]["from_pretrained"] = "weights/predictor"
    data["model"]["models"][sub]["lora"] = {"target_modules": ["blocks.{*}.attn.q"], **lora}
    return data


def test_a_lora_section_loads_with_its_defaults(container, load):
    cfg = load(_with_lora(container))
    lora = cfg.model.models["predictor"].lora
    assert (lora.target_modules, lora.rank, lora.alpha, lora.dropout) == (
        ["blocks.{*}.attn.q"],
        16,
        16.0,
        0.0,
    )
    assert cfg.training.trainable_submodels == ["predictor"]


def test_the_single_model_form_takes_lora_at_model_level(load):
    lora = {"target_modules": ["blocks.{*}.q"], "rank": 4}
    cfg = load({"model": {"model_id": "toy_dit", "from_pretrained": "weights", "lora": lora}})
    assert cfg.model.sub_models()["model"].lora.rank == 4


def test_lora_dropout_above_zero_is_refused_saying_why(container, load_error, problem_at):
    err = load_error(_with_lora(container, dropout=0.1))
    msg = problem_at(err, "model.models.predictor.lora.dropout")
    assert "expected 0" in msg and "context parallelism" in msg


def test_lora_needs_at_least_one_target_pattern(container, load_error, problem_at):
    err = load_error(_with_lora(container, target_modules=[]))
    assert "at least one module pattern" in problem_at(err, "model.models.predictor.lora.target_modules")


def test_lora_target_patterns_use_the_plan_syntax(container, load_error, problem_at):
    err = load_error(_with_lora(container, target_modules=["blocks.{x}.q"]))
    assert "bad brace group {x}" in problem_at(err, "model.models.predictor.lora.target_modules[0]")


def test_lora_rank_and_alpha_must_be_positive(container, load_error, problem_at):
    err = load_error(_with_lora(container, rank=0, alpha=0))
    assert "greater than or equal to 1" in problem_at(err, "model.models.predictor.lora.rank")
    assert "greater than 0" in problem_at(err, "model.models.predictor.lora.alpha")


def test_lora_on_a_frozen_sub_model_is_refused(container, load_error, problem_at):
    err = load_error(_with_lora(container, sub="ae"))
    assert "`ae` is frozen" in problem_at(err, "model.models.ae.lora")


def test_lora_on_a_sub_model_left_out_of_trainable_submodels_is_refused(container, load_error, problem_at):
    data = _with_lora(container)
    data["model"]["models"]["text_encoder"]["freeze"] = False
    data["training"] = {"trainable_submodels": ["text_encoder"]}
    err = load_error(data)
    assert "not in training.trainable_submodels" in problem_at(err, "model.models.predictor.lora")


def test_unknown_lora_keys_are_errors_with_a_suggestion(container, load_error, problem_at):
    err = load_error(_with_lora(container, rnak=8))
    assert "did you mean `rank`" in problem_at(err, "model.models.predictor.lora.rnak")


def test_lora_on_a_sub_model_without_pretrained_weights_is_refused(container, load_error, problem_at):
    data = _with_lora(container)
    del data["model"]["models"]["predictor"]["from_pretrained"]
    err = load_error(data)
    assert "LoRA adapts pretrained weights" in problem_at(err, "model.models.predictor.lora")
