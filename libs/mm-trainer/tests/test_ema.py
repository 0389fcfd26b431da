"""ParameterEMA: the average it keeps, which parameters it covers, under which keys."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from mm_trainer import ModelContainer, ParameterEMA, freeze, inject_lora
from torch import nn


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 2))


def test_the_average_after_n_steps_is_the_decay_formula_over_the_recorded_weights():
    model, decay = _model(), 0.7
    ema = ParameterEMA(model, decay=decay)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    expected = {k: v.detach().double().clone() for k, v in model.state_dict().items()}
    for step in range(4):
        model(torch.randn(3, 4, generator=torch.Generator().manual_seed(step))).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        ema.update()
        for key, weight in model.state_dict().items():
            expected[key] = decay * expected[key] + (1 - decay) * weight.double()
    averages = ema.state_dict()
    assert set(averages) == set(expected)
    for key, value in averages.items():
        assert value.dtype == torch.float32
        torch.testing.assert_close(value.double(), expected[key], rtol=1e-6, atol=1e-7)
        assert not torch.equal(value, model.state_dict()[key])  # it lags the weights


def test_only_trainable_parameters_are_averaged_under_the_containers_state_dict_keys():
    encoder, predictor = _model(), _model()
    freeze(encoder)
    container = ModelContainer({"encoder": encoder, "predictor": predictor}, trainable=("predictor",))
    predictor[1].requires_grad_(False)  # a frozen part of a trained sub-model
    keys = set(ParameterEMA(container, decay=0.9).state_dict())
    assert keys == {"predictor.0.weight", "predictor.0.bias", "predictor.2.weight", "predictor.2.bias"}


def test_with_lora_the_average_covers_the_adapters_only():
    container = ModelContainer({"predictor": _model()}, trainable=("predictor",))
    inject_lora(container, {"predictor": SimpleNamespace(target_modules=["0", "2"], rank=2, alpha=2.0)})
    keys = set(ParameterEMA(container, decay=0.9).state_dict())
    assert keys == {f"predictor.{i}.lora_{ab}.default.weight" for i in (0, 2) for ab in "AB"}


def test_tied_parameters_are_averaged_once_under_each_key():
    tied = nn.ModuleDict({"a": nn.Linear(3, 3, bias=False), "b": nn.Linear(3, 3, bias=False)})
    tied.b.weight = tied.a.weight
    averages = ParameterEMA(tied, decay=0.9).state_dict()
    assert set(averages) == {"a.weight", "b.weight"} and averages["a.weight"] is averages["b.weight"]


def test_loading_a_state_with_other_keys_is_refused_naming_them():
    ema = ParameterEMA(_model(), decay=0.9)
    state = dict(ema.state_dict())
    state["3.weight"] = state.pop("2.weight")
    with pytest.raises(KeyError, match=r"missing keys \['2.weight'\], unexpected keys \['3.weight'\]"):
        ema.load_state_dict(state)


def test_a_loaded_state_replaces_the_average():
    source, target = ParameterEMA(_model(), decay=0.9), ParameterEMA(nn.Sequential(*_model()), decay=0.9)
    saved = {k: torch.full_like(v, 0.25) for k, v in source.state_dict().items()}
    target.load_state_dict(saved)
    assert all(torch.equal(v, saved[k]) for k, v in target.state_dict().items())


def test_a_model_without_trainable_parameters_is_refused():
    model = _model()
    freeze(model)
    with pytest.raises(ValueError, match="training.ema: the model has no trainable parameter"):
        ParameterEMA(model, decay=0.9)


def test_the_average_is_in_the_parameters_inside_swapped_in_and_the_trained_weights_after_it():
    model = _model()
    ema = ParameterEMA(model, decay=0.5)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    trained = {k: v.clone() for k, v in model.state_dict().items()}
    ema.update()
    with pytest.raises(RuntimeError, match="inside"):
        with ema.swapped_in():
            for key, value in model.state_dict().items():
                torch.testing.assert_close(value, ema.state_dict()[key])
                assert not torch.equal(value, trained[key])
            raise RuntimeError("inside")  # the trained weights come back even so
    for key, value in model.state_dict().items():
        assert torch.equal(value, trained[key])


def test_a_validation_sees_the_average_with_validation_ema_and_the_trained_weights_without():
    from mm_trainer.trainer import Trainer

    model = _model()
    ema = ParameterEMA(model, decay=0.5)
    with torch.no_grad():
        model[0].weight.add_(1.0)
    ema.update()
    seen = []
    validator = SimpleNamespace(run=lambda step, metrics: seen.append(model[0].weight.detach().clone()) or {})
    for flag in (True, False):
        settings = SimpleNamespace(training=SimpleNamespace(validation=SimpleNamespace(ema=flag)))
        Trainer._validate(SimpleNamespace(config=settings, ema=ema), validator, 1, None)  # the trainer's step
    torch.testing.assert_close(seen[0], ema.state_dict()["0.weight"])
    assert torch.equal(seen[1], model[0].weight) and not torch.equal(seen[0], seen[1])
