"""LoRA injection: which layers get adapters, what trains, how the base loads, where adapters start,
and what a container checkpoint holds."""

from __future__ import annotations

import copy
import sys
from types import SimpleNamespace

import pytest
import torch
from mm_checkpoint import load_checkpoint_with_conversion, materialize_meta
from mm_parallel import PatternMatchError
from mm_trainer import ModelContainer, inject_lora
from safetensors.torch import save_file
from torch import nn

RANK, ALPHA = 2, 6.0


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)
        self.ffn = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.ffn(self.norm(self.q(x)))


class Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _lora(*targets: str) -> SimpleNamespace:
    return SimpleNamespace(
        target_modules=list(targets or ("blocks.{*}.q", "blocks.{*}.ffn.2")), rank=RANK, alpha=ALPHA
    )


def _container(module: nn.Module | None = None, **lora) -> tuple[ModelContainer, object]:
    torch.manual_seed(0)
    container = ModelContainer({"predictor": module or Toy()}, trainable=("predictor",))
    return container, inject_lora(container, {"predictor": _lora(*lora.get("targets", ()))})


def test_matched_linears_get_adapters_and_only_the_adapters_train():
    container, adapters = _container()
    assert adapters.targets["predictor"].paths == (
        "blocks.0.q",
        "blocks.0.ffn.2",
        "blocks.1.q",
        "blocks.1.ffn.2",
    )
    trainable = sorted(n for n, p in container.predictor.named_parameters() if p.requires_grad)
    assert trainable == sorted(
        f"blocks.{i}.{layer}.lora_{ab}.default.weight"
        for i in (0, 1)
        for layer in ("q", "ffn.2")
        for ab in "AB"
    )
    a = container.predictor.blocks[0].q.lora_A["default"].weight
    assert a.shape == (RANK, 8) and container.predictor.blocks[0].q.scaling["default"] == ALPHA / RANK


def test_a_pattern_matching_a_layer_that_is_not_linear_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"'blocks.\{\*\}.norm' matches 'blocks.0.norm', a LayerNorm"):
        _container(targets=("blocks.{*}.norm",))


def test_a_pattern_matching_nothing_names_the_key_and_the_closest_paths():
    with pytest.raises(
        PatternMatchError, match=r"model.models.predictor.lora.target_modules: .*'blocks.0.q'"
    ):
        _container(targets=("blocks.{*}.qq",))


def test_the_base_loads_under_its_own_key_names_into_a_meta_built_adapted_model(tmp_path):
    torch.manual_seed(1)
    reference = Toy()
    save_file({k: v.contiguous() for k, v in reference.state_dict().items()}, tmp_path / "model.safetensors")
    with torch.device("meta"):
        meta = Toy()
    container, adapters = _container(meta)
    materialize_meta(container.predictor, "cpu")
    with adapters.base_names("predictor", container.predictor):
        assert set(container.predictor.state_dict()) == set(reference.state_dict())
        report = load_checkpoint_with_conversion(container.predictor, tmp_path, fmt="hf")
    assert report.complete
    adapters.init_adapters(container, seed=3)
    x = torch.randn(4, 8)
    assert torch.equal(container.predictor(x), reference(x))  # B = 0: training starts at the base model


def test_adapter_init_is_keyed_by_seed_and_path_and_b_starts_at_zero():
    def a_and_b(seed: int, path: str = "blocks.1.q"):
        container, adapters = _container()
        adapters.init_adapters(container, seed=seed)
        layer = container.predictor.get_submodule(path)
        return layer.lora_A["default"].weight.detach().clone(), layer.lora_B[
            "default"
        ].weight.detach().clone()

    a, b = a_and_b(7)
    assert torch.equal(a, a_and_b(7)[0]) and not torch.equal(a, a_and_b(8)[0])
    assert not torch.equal(a, a_and_b(7, "blocks.0.q")[0]) and torch.count_nonzero(b) == 0


def test_a_container_checkpoint_holds_only_the_adapters_and_loads_them_back():
    container, adapters = _container()
    adapters.init_adapters(container, seed=0)
    state = container.state_dict()
    assert sorted(state) == sorted(f"predictor.{k}" for k in container.partial_checkpoints["predictor"])
    assert len(state) == 8 and all(".lora_" in k for k in state)
    other, _ = _container()
    other.load_state_dict(state)  # strict: the base is not expected in a checkpoint
    x = torch.randn(2, 8)
    assert torch.equal(other.predictor(x), container.predictor(x))
    del state["predictor.blocks.0.q.lora_B.default.weight"]
    with pytest.raises(RuntimeError, match=r"missing keys \['predictor.blocks.0.q.lora_B.default.weight'\]"):
        other.load_state_dict(state)


def test_without_peft_the_error_names_the_key_and_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)
    with pytest.raises(ImportError, match=r"model.models.predictor.lora: .*pip install 'mm-trainer\[lora\]'"):
        _container()


@pytest.mark.slow
def test_adapter_init_on_fsdp_shards_equals_the_unsharded_init(distributed):
    def init_sharded(rank: int, world: int) -> dict[str, torch.Tensor]:
        from torch.distributed.fsdp import fully_shard

        container, adapters = _container()
        for block in container.predictor.blocks:
            fully_shard(block)
        adapters.init_adapters(container, seed=5)
        return {k: v.full_tensor() for k, v in container.predictor.state_dict().items() if ".lora_" in k}

    sharded = distributed(init_sharded, 2)[0]
    container, adapters = _container()
    adapters.init_adapters(container, seed=5)
    plain = {k: v for k, v in container.predictor.state_dict().items() if ".lora_" in k}
    assert sharded.keys() == plain.keys() and all(torch.equal(sharded[k], plain[k]) for k in plain)


def test_a_bf16_base_stays_bf16_while_its_adapters_are_fp32():
    container, _ = _container(Toy().to(torch.bfloat16))
    dtypes = {n: p.dtype for n, p in container.predictor.named_parameters()}
    assert {d for n, d in dtypes.items() if ".lora_" in n} == {torch.float32}
    assert {d for n, d in dtypes.items() if ".lora_" not in n} == {torch.bfloat16}


def test_with_its_adapters_disabled_the_container_computes_its_base_and_then_its_adapted_model_again():
    torch.manual_seed(1)
    base = Toy()
    container, adapters = _container(copy.deepcopy(base))
    adapters.init_adapters(container, seed=0)
    with torch.no_grad():
        for name, p in container.predictor.named_parameters():
            if "lora_B" in name:
                p.normal_()  # B = 0 at init: the adapted model would be the base
    x = torch.randn(4, 8)
    adapted = container.predictor(x)
    assert not torch.allclose(adapted, base(x))
    with container.adapters_disabled():
        torch.testing.assert_close(container.predictor(x), base(x))
    torch.testing.assert_close(container.predictor(x), adapted)


def test_disabling_adapters_where_there_are_none_is_refused():
    container = ModelContainer({"predictor": Toy()}, trainable=("predictor",))
    with pytest.raises(ValueError, match="adapters_disabled: the modules hold no LoRA layer"):
        with container.adapters_disabled():
            pass
