"""Recompute, compile and activation offload act on what autograd saves, and compose on one module.

Evidence, not markers: a recomputed module's forward runs again in backward and autograd keeps
only its inputs; an offloaded module's saved tensors go to the offload's own saved-tensor hooks
(autograd uses only the innermost hooks, so a probe around the call sees none of them). On CPU the
host copy itself cannot be told from the original, so these tests pin where the tensors go.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable

import pytest
import torch
from mm_trainer import apply_features, check_compile, plan_features
from torch import nn
from torch._dynamo.utils import counters
from torch.utils._python_dispatch import TorchDispatchMode

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


class OpCounter(TorchDispatchMode):
    """Counts the aten op packets dispatched while active."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        self.counts[func.overloadpacket] += 1
        return func(*args, **(kwargs or {}))


def backward_ops(model: Net) -> Counter:
    """The ops autograd runs in backward of one step (forward re-runs included)."""
    x = torch.randn(BATCH, DIM, generator=torch.Generator().manual_seed(0), requires_grad=True)
    loss = model.blocks[1](model.blocks[0](x)).square().sum()
    with OpCounter() as counter:
        loss.backward()
    return counter.counts


def test_selective_recompute_runs_the_cheap_ops_again_but_keeps_the_matmul_outputs():
    plain, selective = featured(recompute_modules=["blocks.0"], recompute_policy="selective")
    _, full = featured(recompute_modules=["blocks.0"])
    assert_same_grads(selective, plain)
    aten = torch.ops.aten
    ops = {name: backward_ops(m) for name, m in (("plain", plain), ("selective", selective), ("full", full))}
    assert ops["plain"][aten.tanh] == 0 and ops["selective"][aten.tanh] == ops["full"][aten.tanh] == 1
    assert ops["selective"][aten.addmm] == ops["plain"][aten.addmm] == 0
    assert ops["full"][aten.addmm] == 1  # full recompute runs the inner linear again (then stops early)


def test_recompute_every_k_th_matched_module_counts_in_module_order():
    model = nn.Sequential(*(nn.Linear(2, 2) for _ in range(12)))
    report = plan_features(model, recompute_modules=["{*}"], recompute_every=5)
    assert report.recompute == ["0", "5", "10"]  # module order, not "10" < "5" by name
    assert report.lines() == ["recompute (full, every 5 matched): 3 module(s): 0, 5, 10"]


@pytest.mark.parametrize(
    ("backend", "mode", "device", "message"),
    [
        ("inductor", "default", "npu", "inductor generates no Ascend NPU code"),
        ("no_such_backend", "default", "cpu", "not a registered torch.compile backend"),
        ("aot_eager", "max-autotune", "cpu", "applies to the inductor backend only"),
        ("inductor", "reduce-overhead", "cpu", "captures CUDA graphs; cpu has none"),
    ],
)
def test_a_compile_choice_the_device_cannot_run_is_refused(backend, mode, device, message):
    with pytest.raises(ValueError, match=message):
        check_compile(backend, mode, device)


def compiled_pair(backend: str, **plans: list[str] | str) -> tuple[Net, Net]:
    torch._dynamo.reset()
    counters.clear()
    return featured(compile_modules=["blocks.{*}"], compile_backend=backend, **plans)


def test_compiled_blocks_train_the_eager_gradients_from_one_graph():
    plain, model = compiled_pair("inductor")
    expected, got = step(plain), step(model)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-7, msg=name)
    assert counters["stats"]["unique_graphs"] == 1  # both blocks run the same compiled graph


def test_selective_recompute_of_a_compiled_block_keeps_the_gradients():
    plain, model = compiled_pair("aot_eager", recompute_modules=["blocks.0"], recompute_policy="selective")
    assert_same_grads(model, plain)
    assert counters["stats"]["unique_graphs"] >= 1  # compiled, not silently left eager


class SaveOnCpuSpy(torch.autograd.graph.save_on_cpu):
    """torch's own ``save_on_cpu``, recording the keywords of each use and the devices it packed to."""

    uses: list[dict] = []

    def __init__(self, **kwargs) -> None:  # noqa: ANN003
        super().__init__(**kwargs)
        use = {"kwargs": kwargs, "packed_to": set()}
        SaveOnCpuSpy.uses.append(use)
        pack = self.pack_hook

        def recording_pack(tensor):  # noqa: ANN001, ANN202
            device, packed = pack(tensor)
            use["packed_to"].add(packed.device.type)
            return device, packed

        self.pack_hook = recording_pack


@pytest.fixture
def save_on_cpu_spy(monkeypatch):  # noqa: ANN001, ANN201
    SaveOnCpuSpy.uses = []
    monkeypatch.setattr(torch.autograd.graph, "save_on_cpu", SaveOnCpuSpy)
    return SaveOnCpuSpy.uses


def test_offload_names_the_device_in_use_to_save_on_cpu(save_on_cpu_spy):
    _, model = featured(activation_offload_modules=["blocks.0"])
    model(torch.randn(BATCH, DIM)).sum().backward()
    assert [u["kwargs"] for u in save_on_cpu_spy] == [{"pin_memory": False, "device_type": "cpu"}]


def test_offload_pins_host_copies_on_an_accelerator_and_names_its_type():
    # CUDA fake tensors in the CPU build (autograd itself cannot run on them here): the options follow the
    # activations' device, whatever accelerator the host has
    from mm_trainer.model.features import offload_options
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        activation = torch.empty(BATCH, DIM, device="cuda")
    assert offload_options(((activation,), {"scale": 2.0})) == {"pin_memory": True, "device_type": "cuda"}
    assert offload_options(((), {"x": torch.ones(1)})) == {"pin_memory": False, "device_type": "cpu"}
