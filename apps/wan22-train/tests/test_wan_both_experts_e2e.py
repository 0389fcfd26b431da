"""`expert: both`: both A14B experts train in one job at data-parallel 2; one checkpoint holds both.

The run is ``wan22-train``'s ``main`` on forked gloo ranks (the ``main_forked`` fixture)."""

from __future__ import annotations

import pytest
import torch
from mm_checkpoint import restricted_dcp_load
from safetensors.torch import load_file
from torch.distributed.checkpoint import FileSystemReader
from wan22_train.cli import main as wan22_main
from wan22_train.configs import config_path
from wan22_train.key_maps import diffusers_to_native
from wan22_train.tiny import make_tiny, tiny_overrides

pytestmark = pytest.mark.slow


def test_both_experts_share_one_checkpoint_sample_across_the_boundary_and_export_apart(tmp_path, main_forked):
    tiny = make_tiny(tmp_path / "tiny")
    overrides = [
        *tiny_overrides(tiny),
        f"model.models.predictor_low.from_pretrained={tiny / 'transformer'}",
        f"training.save={tmp_path / 'ckpt'}",
        "training.train_iters=16",
        "training.micro_batch_size=1",
        "parallel.ulysses_parallel_size=1",  # data parallel 2: ranks must still pick the same expert
    ]
    main_forked(wan22_main, ["--config", str(config_path("tiny_t2v_both.yaml")), *overrides], nproc=2)

    start = diffusers_to_native(load_file(tiny / "transformer" / "diffusion_pytorch_model.safetensors"))
    ckpt = tmp_path / "ckpt" / "iter_0000016"
    keys = FileSystemReader(str(ckpt)).read_metadata().state_dict_metadata
    for expert in ("predictor", "predictor_low"):
        weight = f"model.{expert}.blocks.0.self_attn.q.weight"
        assert weight in keys
        state = {weight: torch.empty(start["blocks.0.self_attn.q.weight"].shape)}
        restricted_dcp_load(state, ckpt, allow_partial_load=True, no_dist=True)
        assert not torch.equal(state[weight], start["blocks.0.self_attn.q.weight"]), f"{expert} never trained"
    assert not any("text_encoder" in k or k.startswith("model.ae.") for k in keys)

    # Sampling switches experts at the boundary; each expert exports on its own.
    from mm_trainer import load_run_config
    from wan22_train.export import export_predictor
    from wan22_train.sampling import load_for_sampling, sample_video

    config = load_run_config(tmp_path / "ckpt")
    modules = load_for_sampling(config, tmp_path / "ckpt")
    assert modules["boundary_timestep"] == pytest.approx(875.0, abs=1.0)  # t2v: high noise for t >= 875
    calls = {"predictor": 0, "predictor_low": 0}
    for name in calls:
        modules[name].register_forward_hook(lambda *a, name=name: calls.__setitem__(name, calls[name] + 1))
    sample_video(modules, "a red ball", num_frames=9, height=32, width=32, steps=10, shift=5.0)
    assert calls["predictor"] > 0 and calls["predictor_low"] > 0 and sum(calls.values()) == 10

    low = export_predictor(config, tmp_path / "ckpt", tmp_path / "transformer_2", submodel="predictor_low")
    from diffusers import WanTransformer3DModel

    exported = diffusers_to_native(WanTransformer3DModel.from_pretrained(low).state_dict())
    weight = "blocks.0.self_attn.q.weight"
    state = {f"model.predictor_low.{weight}": torch.empty(exported[weight].shape)}
    restricted_dcp_load(state, ckpt, allow_partial_load=True, no_dist=True)
    assert torch.equal(exported[weight], state[f"model.predictor_low.{weight}"])
