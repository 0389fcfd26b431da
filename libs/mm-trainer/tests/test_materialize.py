"""Meta-built sub-models: materialized on the device, ties kept, lost non-persistent buffers caught."""

import pytest
import torch
from mm_trainer.model.build import materialize as _materialize
from torch import nn


class WithTable(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.register_buffer("table", torch.arange(4.0), persistent=False)


def test_a_lost_non_persistent_buffer_is_an_error_naming_it():
    with torch.device("meta"):
        module = WithTable()
    with pytest.raises(
        ValueError, match=r"model.models.predictor: .*\['table'\].*init_non_persistent_buffers"
    ):
        _materialize("predictor", module, torch.device("cpu"))


def test_the_module_can_rebuild_its_buffers_and_ties_survive():
    class Rebuilds(WithTable):
        def __init__(self) -> None:
            super().__init__()
            self.out = nn.Linear(4, 4)
            self.out.weight = self.proj.weight

        def init_non_persistent_buffers(self) -> None:
            self.table = torch.arange(4.0)

    with torch.device("meta"):
        module = Rebuilds()
    _materialize("predictor", module, torch.device("cpu"))
    assert torch.equal(module.table, torch.arange(4.0))
    assert module.out.weight is module.proj.weight and not module.proj.weight.is_meta
