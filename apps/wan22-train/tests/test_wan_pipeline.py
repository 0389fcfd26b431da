"""The Wan pipeline's noising, target, weights and expert ranges, against the formulas of docs/DESIGN.md
"The flow-match grid" and "Wan2.2 expert split"."""

from __future__ import annotations

import math

import pytest
import torch
from mm_pipelines import SampleRNG
from wan22_train.pipeline import Wan22Pipeline


def recipe_sigma(index: int, n: int = 1000, shift: float = 5.0) -> float:
    s = 1.0 - index / n  # linspace(1, 0, N + 1) without its last point (extra_one_step)
    return shift * s / (1 + (shift - 1) * s)


def weight(index: int, n: int = 1000, shift: float = 5.0) -> float:
    ys = [math.exp(-2 * ((1000 * recipe_sigma(i, n, shift) - 500) / 1000) ** 2) for i in range(n)]
    lo = min(ys)
    return (ys[index] - lo) * n / sum(y - lo for y in ys)


@pytest.mark.parametrize(("expert", "task", "lo", "hi"), [
    ("high_noise", "t2v", 0, 417), ("low_noise", "t2v", 417, 1000), ("high_noise", "i2v", 0, 358),
])  # fmt: skip
def test_noising_target_and_weight_equal_the_formulas(expert, task, lo, hi):
    pipeline = Wan22Pipeline.from_options({"task": task, "expert": expert})
    x0 = torch.randn(2, 4, 3, 4, 4, dtype=torch.float32)
    conditions = {"latents": x0, "prompt_embeds": torch.zeros(2, 3, 8)}
    if task == "i2v":
        conditions["image_condition"] = torch.zeros(2, 20, 3, 4, 4)
    seen = set()
    for seed in range(40):
        keys = SampleRNG.for_batch(2, seed=seed)
        noised = pipeline.noising(conditions, keys)
        for i, index in enumerate(noised["indices"].tolist()):
            seen.add(index)
            assert lo <= index < hi
            sigma = recipe_sigma(index)
            noise = torch.randn(x0.shape[1:], generator=keys.sample_generators("noise")[i])
            torch.testing.assert_close(noised["hidden_states"][i, :4], (1 - sigma) * x0[i] + sigma * noise)
            torch.testing.assert_close(noised["target"][i], noise - x0[i])
            assert noised["timestep"][i].item() == pytest.approx(1000 * sigma, rel=1e-6)
            assert noised["weight"][i].item() == pytest.approx(weight(index), rel=1e-5)
    assert len(seen) > 60


def test_high_noise_t2v_expert_sees_only_timesteps_at_or_above_875():
    pipeline = Wan22Pipeline.from_options({"task": "t2v", "expert": "high_noise"})
    assert pipeline.scheduler.timesteps_for(torch.tensor([416])).item() >= 875
    assert pipeline.scheduler.timesteps_for(torch.tensor([417])).item() < 875


def test_unknown_pipeline_options_are_named():
    with pytest.raises(ValueError, match="unknown Wan pipeline options \\['shfit'\\]"):
        Wan22Pipeline.from_options({"shfit": 5.0})


class _Recorder(torch.nn.Module):
    def __init__(self, name: str, calls: list) -> None:
        super().__init__()
        self.name, self.calls, self.w = name, calls, torch.nn.Parameter(torch.ones(()))

    def forward(self, hidden, timestep, text):
        self.calls.append((self.name, float(timestep[0])))
        return hidden * self.w


def test_expert_both_routes_each_step_by_its_timestep_whatever_the_micro_batch():
    pipeline = Wan22Pipeline.from_options({"task": "t2v", "expert": "both"})
    assert pipeline.boundary_index == 417
    calls: list = []
    container = torch.nn.Module()
    container.predictor, container.predictor_low = (
        _Recorder("predictor", calls),
        _Recorder("predictor_low", calls),
    )
    conditions = {"latents": torch.randn(2, 4, 3, 4, 4), "prompt_embeds": torch.zeros(2, 3, 8)}
    for step in range(30):
        for ids in ([0, 1], [2, 3]):  # two micro-batches (or ranks) of one step: the same expert
            keys = SampleRNG(seed=0, step=step, sample_ids=ids)
            pipeline.predict(container, pipeline.noising(conditions, keys))
        assert calls[-1] == calls[-2]
    assert {name for name, _ in calls} == {"predictor", "predictor_low"}
    for name, t in calls:
        assert (t >= 875) == (name == "predictor"), (name, t)


def test_ti2v_gives_the_clean_first_frame_timestep_zero_per_token():
    from wan22_train.model import WanDiT, WanDiTConfig

    pipeline = Wan22Pipeline.from_options({"task": "ti2v"})
    container = torch.nn.Module()
    container.predictor = WanDiT(WanDiTConfig(model_type="ti2v", in_dim=4, out_dim=4, dim=32, ffn_dim=64,
                                              num_heads=2, num_layers=1, text_dim=8, freq_dim=16))  # fmt: skip
    seen = []
    container.predictor.register_forward_pre_hook(lambda mod, args: seen.append(args[1].clone()))
    conditions = {"latents": torch.randn(2, 4, 3, 4, 6), "prompt_embeds": torch.randn(2, 3, 8)}
    noised = pipeline.noising(conditions, SampleRNG.for_batch(2))
    pipeline.predict(container, noised)
    (timestep,) = seen
    per_frame = (4 // 2) * (6 // 2)
    assert timestep.shape == (2, 3 * per_frame)
    assert torch.all(timestep[:, :per_frame] == 0)
    assert torch.all(timestep[:, per_frame:] == noised["timestep"][:, None])
    assert torch.equal(noised["hidden_states"][:, :, 0], conditions["latents"][:, :, 0])  # frame 0 is clean


def test_training_flops_count_matches_a_profiler_count_of_the_blocks():
    from torch.utils.flop_counter import FlopCounterMode
    from wan22_train.model import WanDiTConfig
    from wan22_train.predictor import WanPredictor

    model = WanPredictor(WanDiTConfig(in_dim=4, out_dim=4, dim=256, ffn_dim=1024, num_heads=4, num_layers=4,
                                      text_dim=16, freq_dim=32))  # fmt: skip
    x, t, text = torch.randn(1, 4, 2, 8, 8), torch.tensor([500.0]), torch.randn(1, 12, 16)
    with FlopCounterMode(display=False) as counter:
        model(x, t, text).sum().backward()
    counted = counter.get_total_flops()
    estimate = model.training_flops(video_tokens=2 * 4 * 4, text_tokens=12)
    assert estimate == pytest.approx(counted, rel=0.03)  # the embeddings and head are left out
