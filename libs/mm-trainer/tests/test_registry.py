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
