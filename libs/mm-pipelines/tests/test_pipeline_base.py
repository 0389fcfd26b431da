"""GenerativePipelineBase: stage orchestration, role lookup and grad only for trainable sub-models."""

from __future__ import annotations

import pytest
import torch
from mm_pipelines import GenerativePipelineBase, PipelineOutput, call_role, is_trainable
from torch import nn


class RecordingPipeline(GenerativePipelineBase):
    """Squares a value through the predictor; records the stage order."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.calls: list[str] = []

    def prepare_conditions(self, container, batch):
        self.calls.append("prepare_conditions")
        return {"x": batch["x"]}

    def noising(self, conditions, generator=None):
        self.calls.append("noising")
        return {"x": conditions["x"] + 1.0}

    def predict(self, container, noised):
        self.calls.append("predict")
        return self.call(container, "predictor", noised["x"])

    def compute_loss(self, prediction, noised):
        self.calls.append("compute_loss")
        return prediction.pow(2).mean()

    def metrics(self, container, noised):
        return {"num_samples": float(noised["x"].shape[0])}


class Holder:
    """A plain (non-Module) container."""

    def __init__(self, **modules: nn.Module) -> None:
        for name, module in modules.items():
            setattr(self, name, module)


def test_forward_runs_the_four_stages_in_order_and_returns_loss_and_metrics() -> None:
    pipe = RecordingPipeline()
    lin = nn.Linear(2, 2)
    out = pipe.forward(Holder(predictor=lin), x=torch.ones(3, 2))
    assert isinstance(out, PipelineOutput)
    assert pipe.calls == ["prepare_conditions", "noising", "predict", "compute_loss"]
    torch.testing.assert_close(out.loss, lin(torch.full((3, 2), 2.0)).pow(2).mean())
    assert out.metrics == {"num_samples": 3.0}


def test_pipeline_is_not_a_module_and_owns_no_parameters() -> None:
    assert not isinstance(RecordingPipeline(), nn.Module)


def test_roles_map_to_other_attribute_names() -> None:
    pipe = RecordingPipeline(roles={"predictor": "dit"})
    out = pipe(Holder(dit=nn.Linear(2, 2)), x=torch.ones(1, 2))
    assert torch.isfinite(out.loss)


def test_missing_role_names_the_role_and_the_known_sub_models() -> None:
    container = nn.Module()
    container.ae = nn.Identity()
    with pytest.raises(AttributeError, match=r"'predictor'.*\['ae'\]"):
        RecordingPipeline()(container, x=torch.ones(1, 2))


def test_frozen_role_runs_without_grad_trainable_role_with_grad() -> None:
    frozen, trainable = nn.Linear(2, 2).requires_grad_(False), nn.Linear(2, 2)
    holder = Holder(frozen=frozen, trainable=trainable)
    x = torch.ones(1, 2, requires_grad=True)
    assert not call_role(holder, "frozen", x).requires_grad
    assert call_role(holder, "trainable", x).requires_grad


def test_container_declaration_overrides_requires_grad() -> None:
    class Declared(Holder):
        def is_trainable(self, role: str) -> bool:
            return role == "predictor"

    holder = Declared(predictor=nn.Linear(2, 2), text_encoder=nn.Linear(2, 2))
    assert is_trainable(holder, "predictor") and not is_trainable(holder, "text_encoder")
    assert not call_role(holder, "text_encoder", torch.ones(1, 2)).requires_grad


def test_call_goes_through_forward_so_module_hooks_fire() -> None:
    fired: list[str] = []
    module = nn.Linear(2, 2)
    module.register_forward_pre_hook(lambda mod, args: fired.append("pre"))
    call_role(Holder(predictor=module), "predictor", torch.ones(1, 2))
    assert fired == ["pre"]


def test_call_of_missing_method_names_it() -> None:
    with pytest.raises(AttributeError, match="'encode'"):
        call_role(Holder(ae=nn.Identity()), "ae", torch.ones(1), method="encode")


def test_frozen_call_does_not_enable_grad_inside_an_outer_no_grad() -> None:
    with torch.no_grad():
        out = call_role(Holder(predictor=nn.Linear(2, 2)), "predictor", torch.ones(1, 2))
    assert not out.requires_grad
