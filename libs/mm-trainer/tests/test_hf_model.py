"""The generic HF path: a transformers folder builds a model with a loss, on meta too, and packs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    """A random tiny ``Qwen2ForCausalLM`` saved with ``save_pretrained``."""
    config = transformers.Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)  # fmt: skip
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("qwen2")
    transformers.Qwen2ForCausalLM(config).save_pretrained(out)
    return out


def section(path, **overrides):
    base = dict(model_id="hf_causal_lm", from_pretrained=str(path), checkpoint_path=None, meta_init=False, dtype=None,
                config={}, load_format="auto", weight_transform=None,
                checkpoint_conversion_dir=None)  # fmt: skip
    return SimpleNamespace(**{**base, **overrides})


def test_an_unregistered_id_on_a_transformers_folder_is_refused_naming_the_generic_id(tiny_lm):
    from mm_trainer import ModelHub
    from mm_trainer.registry.registries import RegistryError

    with pytest.raises(RegistryError) as info:
        ModelHub.build(section(tiny_lm, model_id="qwen25_vl"))
    message = str(info.value)
    assert "unknown model id 'qwen25_vl'" in message and "set model_id: hf_causal_lm" in message, message


def test_the_generic_id_on_a_transformers_folder_trains_with_a_loss(tiny_lm):
    from mm_trainer import HFModel, ModelHub

    model = ModelHub.build(section(tiny_lm))
    assert isinstance(model, HFModel) and isinstance(model, transformers.Qwen2ForCausalLM)
    ids = torch.randint(0, 64, (2, 7))
    out = model(input_ids=ids, labels=ids)
    reference = transformers.Qwen2ForCausalLM.from_pretrained(tiny_lm)(input_ids=ids, labels=ids)
    torch.testing.assert_close(out.loss, reference.loss, rtol=0, atol=0)
    assert out.metrics == {"num_samples": 2, "num_tokens": 14}


def test_meta_build_then_setup_weights_equals_from_pretrained(tiny_lm):
    from mm_checkpoint import materialize_meta
    from mm_trainer import ModelHub

    args = section(tiny_lm, model_id="hf_causal_lm", meta_init=True)
    model = ModelHub.build(args)
    assert all(p.is_meta for p in model.parameters())
    materialize_meta(model, "cpu")
    model.init_non_persistent_buffers()
    model.setup_weights(args)
    ids = torch.randint(0, 64, (1, 9))
    want = transformers.Qwen2ForCausalLM.from_pretrained(tiny_lm)(input_ids=ids).logits
    torch.testing.assert_close(model(input_ids=ids, labels=ids).logits, want, rtol=0, atol=0)


def test_packed_rows_keep_samples_apart(tiny_lm):
    from mm_data import IGNORE_INDEX, MultimodalCollator
    from mm_trainer import ModelHub

    model = ModelHub.build(section(tiny_lm)).double()
    items = [
        {"input_ids": ids, "labels": [IGNORE_INDEX] + ids[1:], "media": {}}
        for ids in ([3, 4, 5, 6], [7, 8, 9])
    ]
    sums = []
    for packing in (False, True):
        batch = MultimodalCollator(0, packing=packing)(items)
        batch.pop("skipped")
        with torch.no_grad():
            sums.append(float(model(**batch).loss) * 5)  # 5 labelled tokens
    assert sums[1] == pytest.approx(sums[0], abs=1e-5)


def test_hf_config_overrides_merge_into_config_json(tiny_lm):
    from mm_trainer.model.hf_model import load_hf_config

    args = section(tiny_lm, config={"hf_config": {"rms_norm_eps": 1e-3}, "attn_implementation": "eager"})
    config = load_hf_config(args, transformers.Qwen2Config)
    assert (config.rms_norm_eps, config.hidden_size, config._attn_implementation) == (1e-3, 16, "eager")
    with pytest.raises(ValueError, match="no config.json under from_pretrained"):
        load_hf_config(section(tiny_lm.parent / "nowhere"), transformers.Qwen2Config)


def test_a_subclass_named_for_training_computes_the_upstream_loss_without_a_loss_type_warning(
    tiny_lm, monkeypatch
):
    # transformers picks the loss by the class name: `MyLMForTraining` names none, so without HFModel's
    # fix every forward with labels warned "`loss_type=None` ... unrecognized" (once per process and rank)
    from mm_trainer import HFModel
    from transformers.modeling_utils import logger

    class MyLMForTraining(HFModel, transformers.Qwen2ForCausalLM):
        pass

    warned: list[str] = []
    monkeypatch.setattr(logger, "warning_once", lambda message, *a, **k: warned.append(str(message)))
    model = MyLMForTraining.from_pretrained(section(tiny_lm))
    assert model.loss_type == "ForCausalLM"
    ids = torch.randint(0, 64, (2, 7))
    reference = transformers.Qwen2ForCausalLM.from_pretrained(tiny_lm)(input_ids=ids, labels=ids)
    torch.testing.assert_close(model(input_ids=ids, labels=ids).loss, reference.loss, rtol=0, atol=0)
    assert not [m for m in warned if "loss_type" in m], warned
