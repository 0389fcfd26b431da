"""Registries: clear errors for missing and duplicate ids."""

import pytest
from mm_trainer import Registry, RegistryError


def test_a_missing_id_lists_the_known_ids_and_the_closest():
    reg = Registry("model")
    reg.register("wan2_2_predictor")(object)
    reg.register("umt5")(int)
    with pytest.raises(RegistryError) as err:
        reg.get("wan22_predictor")
    message = str(err.value)
    assert "unknown model id 'wan22_predictor'" in message
    assert "Did you mean 'wan2_2_predictor'?" in message
    assert "['umt5', 'wan2_2_predictor']" in message


def test_registering_another_object_under_a_taken_id_raises():
    reg = Registry("dataset")

    @reg.register("clips")
    class A:
        pass

    class B:
        pass

    with pytest.raises(RegistryError, match="already registered"):
        reg.register("clips")(B)


def test_re_registering_the_same_object_is_allowed():
    reg = Registry("model")
    reg.register("x")(int)
    reg.register("x")(int)
    assert reg.get("x") is int and "x" in reg


def test_the_single_model_form_uses_the_container_its_model_class_names():
    from types import SimpleNamespace

    from mm_trainer import ModelContainer, model_register
    from mm_trainer.model.container import container_class
    from torch import nn

    @model_register("test_registry_holder")
    class Holder(ModelContainer):
        pass

    @model_register("test_registry_held")
    class Held(nn.Linear):
        single_model_container = "test_registry_holder"

    @model_register("test_registry_plain")
    class Plain(nn.Linear):
        pass

    def single(model_id: str) -> SimpleNamespace:
        return SimpleNamespace(container_id=None, is_container=False, model_id=model_id)

    assert container_class(single("test_registry_held")) is Holder
    assert container_class(single("test_registry_plain")) is ModelContainer
