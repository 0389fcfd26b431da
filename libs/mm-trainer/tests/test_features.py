"""Recompute and activation offload act on what autograd saves, and compose on one module.

Evidence, not markers: a recomputed module's forward runs again in backward and autograd keeps
only its inputs; an offloaded module's saved tensors go to the offload's own saved-tensor hooks
(autograd uses only the innermost hooks, so a probe around the call sees none of them). On CPU the
host copy itself cannot be told from the original, so these tests pin where the tensors go.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from mm_trainer import apply_features
from torch import nn

DIM, BATCH = 8, 4


class Block(nn.Module):
    """linear -> tanh -> linear, counting its forward calls."""

    def __init__(self) -> None:
        super().__init__()
        self.inner, self.outer = nn.Linear(DIM, DIM), nn.Linear(DIM, DIM)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.outer(torch.tanh(self.inner(x)))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def step(model: nn.Module, probe: list | None = None) -> dict[str, torch.Tensor]:
    """One forward/backward on a fixed batch; ``probe`` collects the shapes autograd saves outside
    any hooks a feature installed. Returns the gradients."""
    x = torch.randn(BATCH, DIM, generator=torch.Generator().manual_seed(0))
    block = model.blocks[0]

    def call() -> torch.Tensor:
        return block(x.requires_grad_())

    if probe is None:
        h = call()
    else:
        with torch.autograd.graph.saved_tensors_hooks(_recorder(probe), lambda t: t):
            h = call()
    model.blocks[1](h).square().sum().backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def _recorder(probe: list) -> Callable[[torch.Tensor], torch.Tensor]:
    def pack(t: torch.Tensor) -> torch.Tensor:
        probe.append(tuple(t.shape))
        return t

    return pack


def featured(**plans: list[str]) -> tuple[Net, Net]:
    torch.manual_seed(0)
    plain = Net()
    model = copy.deepcopy(plain)
    apply_features(model, **plans)
    return plain, model


def assert_same_grads(model: Net, plain: Net) -> None:
    expected, got = step(plain), step(model)
    assert got.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], msg=name)


def test_recompute_runs_the_forward_again_in_backward_with_the_same_gradients():
    plain, model = featured(recompute_modules=["blocks.0"])
    assert_same_grads(model, plain)
    assert [b.calls for b in model.blocks] == [2, 1]
    assert [b.calls for b in plain.blocks] == [1, 1]


def test_recompute_keeps_only_the_module_inputs():
    plain, model = featured(recompute_modules=["blocks.0"])
    saved_plain, saved = [], []
    step(plain, saved_plain)
    step(model, saved)
    assert saved == [(BATCH, DIM)]  # the checkpoint's input; the activations are recomputed
    assert len(saved_plain) > 1  # without recompute: inputs, weights and tanh activations


def test_offload_hands_the_module_saved_tensors_to_its_own_hooks():
    plain, model = featured(activation_offload_modules=["blocks.0"])
    assert_same_grads(model, plain)
    assert [b.calls for b in model.blocks] == [1, 1]  # offload alone recomputes nothing
    saved_plain, saved = [], []
    step(plain, saved_plain)
    step(model, saved)
    assert saved == [] and saved_plain


def test_recompute_and_offload_on_one_module_compose():
    plain, model = featured(recompute_modules=["blocks.{*}"], activation_offload_modules=["blocks.0"])
    assert_same_grads(model, plain)
    assert [b.calls for b in model.blocks] == [2, 2]  # recomputed, although offloaded too
    saved = []
    step(model, saved)
    assert saved == []  # the checkpoint's input went to the offload hooks


def test_offload_inside_a_recomputed_module_is_refused():
    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = Net()

    with pytest.raises(ValueError, match=r"'net.blocks.0' inside 'net' of recompute_plan"):
        apply_features(Outer(), recompute_modules=["net"], activation_offload_modules=["net.blocks.0"])
