"""The qwen2_5_vl trainer model: loading, packing parity, freeze groups, refused context parallelism,
no view from its FSDP2 root."""

from __future__ import annotations

import pytest
import torch
from mm_checkpoint import materialize_meta
from mm_data import IGNORE_INDEX, MultimodalCollator
from safetensors.torch import load_file, save_file


def batch_of(ds, indices, packing):
    batch = MultimodalCollator(ds.template.tokenizer.pad_token_id, packing=packing)(
        [ds.encode(i) for i in indices]
    )
    batch.pop("skipped")
    return batch


def test_packing_and_padding_give_the_same_summed_loss(tiny_dataset, tiny_model):
    # float64 model, but upstream's ForCausalLMLoss computes on logits.float(): the summed losses agree to
    # float32 rounding (~1e-7 relative; an absolute 1e-5 was below it and held by chance on the old data)
    ds, model = tiny_dataset(), tiny_model().double()
    indices = list(range(len(ds)))  # images, videos, one and two assistant turns
    sums = {}
    for packing in (False, True):
        batch = batch_of(ds, indices, packing)
        labelled = int((batch["labels"] != IGNORE_INDEX).sum())
        with torch.no_grad():
            sums[packing] = float(model(**batch).loss) * labelled
    assert sums[True] == pytest.approx(sums[False], rel=1e-6)


def test_meta_build_loads_hub_layout_keys_to_the_from_pretrained_model(
    tiny_root, tiny_dataset, tiny_model, section, tmp_path
):
    # the published Qwen2.5-VL checkpoints name keys visual.* and model.layers.* (pre-5.0 layout)
    from qwen_vl_train.model import Qwen2_5_VLForTraining
    from transformers import Qwen2_5_VLForConditionalGeneration

    hub = tmp_path / "hub"
    hub.mkdir()
    state = load_file(tiny_root / "model" / "model.safetensors")
    legacy = {
        k.replace("model.visual.", "visual.").replace("model.language_model.", "model."): v
        for k, v in state.items()
    }
    assert any(k.startswith("visual.") for k in legacy) and any(k.startswith("model.layers.") for k in legacy)
    save_file(legacy, hub / "model.safetensors")
    (hub / "config.json").write_text((tiny_root / "model" / "config.json").read_text())

    model = tiny_model(from_pretrained=str(hub), meta_init=True)
    assert isinstance(model, Qwen2_5_VLForTraining) and next(model.parameters()).is_meta
    materialize_meta(model, "cpu")
    model.init_non_persistent_buffers()
    model.setup_weights(section(tiny_root, from_pretrained=str(hub)))
    reference = Qwen2_5_VLForConditionalGeneration.from_pretrained(tiny_root / "model").eval()
    batch = batch_of(tiny_dataset(), range(3), packing=False)
    batch.pop("num_samples")
    with torch.no_grad():
        want = reference(**batch).logits
        got = Qwen2_5_VLForConditionalGeneration.forward(model.eval(), **batch).logits
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_freeze_groups_freeze_exactly_their_modules(tiny_model):
    model = tiny_model(config={"freeze_groups": ["vision_tower"]})
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen and all(n.startswith(("model.visual.patch_embed.", "model.visual.blocks.")) for n in frozen)
    assert {n for n, _ in model.named_parameters() if n.startswith("model.visual.blocks.")} <= frozen
    assert all(p.requires_grad for n, p in model.named_parameters() if n.startswith("model.visual.merger."))
    with pytest.raises(ValueError, match="no module group 'vision'; its groups: \\['language_model'"):
        tiny_model(config={"freeze_groups": ["vision"]})


def test_context_parallelism_is_refused_with_the_reason(tiny_model):
    from types import SimpleNamespace

    with pytest.raises(ValueError, match="transformers attention interface cannot split the sequence"):
        tiny_model().setup_context_parallel(SimpleNamespace(cp_size=2))


def test_fsdp2_root_forward_returns_no_view_and_warns_nothing(tiny_dataset, tiny_model, fsdp2_root_outputs):
    # images and videos: upstream passes the media encoders' outputs (per-sample views) through
    batch = batch_of(tiny_dataset(), range(len(tiny_dataset())), packing=False)
    forward = lambda model: model(**batch).to_tuple()  # noqa: E731
    assert fsdp2_root_outputs(tiny_model, forward, blocks="model.language_model.layers") == [True, True]


def test_the_loss_is_upstreams_for_conditional_generation_without_a_loss_type_warning(
    tiny_dataset, tiny_model, monkeypatch
):
    # `Qwen2_5_VLForTraining` is no name transformers maps to a loss: before HFModel set the upstream's
    # loss type, every rank's first forward warned "`loss_type=None` was set in the config but it is
    # unrecognized"
    from transformers.loss.loss_utils import LOSS_MAPPING
    from transformers.modeling_utils import logger

    warned: list[str] = []
    monkeypatch.setattr(logger, "warning_once", lambda message, *a, **k: warned.append(str(message)))
    model = tiny_model()
    assert model.loss_type == "ForConditionalGeneration"
    assert model.loss_function is LOSS_MAPPING["ForConditionalGeneration"]
    with torch.no_grad():
        assert torch.isfinite(model(**batch_of(tiny_dataset(), range(2), packing=False)).loss)
    assert not [m for m in warned if "loss_type" in m], warned
