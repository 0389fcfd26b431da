"""Wan2.2 Flow-GRPO's set-up (``model.pipeline.grpo``, ``tiny_grpo.yaml``): the shipped config passes, and a
run that could not train it is refused by the config check before any weight is read, naming the key; with
both A14B experts (Flow-GRPO and DiffusionNFT) each rollout step and trained step runs the expert of its sigma."""

from __future__ import annotations

import pytest
import torch
from mm_config import ConfigError, check_config
from wan22_train.configs import config_path
from wan22_train.tiny import make_tiny, tiny_overrides


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("tiny"), num_clips=2)


def _check(tiny, *overrides):
    return check_config(config_path("tiny_grpo.yaml"), [*tiny_overrides(tiny), *overrides], world_size=2,
                        check_paths=False)  # fmt: skip


def _refused(tiny, *overrides) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        _check(tiny, *overrides)
    return info.value


def test_the_shipped_config_passes_and_a_full_weight_policy_needs_a_reference_only_with_a_kl_term(tiny):
    _check(tiny)
    _check(tiny, "model.models.predictor.lora=null", "model.pipeline.grpo.kl_weight=0")
    for task in ("i2v", "ti2v"):  # every task rolls out (its first-frame condition kept), guided or not
        _check(tiny, f"model.pipeline.task={task}", "model.pipeline.grpo.guidance_scale=3")
    err = _refused(tiny, "model.models.predictor.lora=null")
    assert err.paths == ["model.models.predictor"], str(err)
    assert "Flow-GRPO needs a reference: add the frozen sub-model `reference`" in str(err)


@pytest.mark.parametrize(
    ("overrides", "path", "words"),
    [
        (["training.rewards=[]"], "model.pipeline.grpo", "training.rewards lists none"),
        (
            ["model.pipeline.grpo.group_size=1"],
            "model.pipeline.grpo.group_size",
            "greater than or equal to 2",
        ),
        (
            ["model.pipeline.grpo.timestep_fraction=0"],
            "model.pipeline.grpo.timestep_fraction",
            "greater than 0",
        ),
        (["model.pipeline.grpo.noise_level=0"], "model.pipeline.grpo.noise_level", "greater than 0"),
        (["model.pipeline.grpo.group=4"], "model.pipeline.grpo.group", "group_size"),
        (["model.pipeline.expert=high_noise"], "model.pipeline.grpo", "expected expert `all` or `both`"),
        (["model.pipeline.dpo={beta: 100}"], "model.pipeline.grpo", "not with dpo"),
        (
            ["data.dataset_id=wan22_cached", "data.dataset={}", "model.pipeline.grpo.guidance_scale=3"],
            "model.pipeline.grpo.guidance_scale",
            "gives pre-encoded prompts without them",
        ),
        (
            ["model.pipeline.grpo.updates_per_rollout=0"],
            "model.pipeline.grpo.updates_per_rollout",
            "greater than or equal to 1",
        ),
        (  # tiny_grpo.yaml saves every 10 of its 20 steps
            ["model.pipeline.grpo.updates_per_rollout=4"],
            "training.save_interval",
            "must be a multiple of model.pipeline.grpo.updates_per_rollout=4",
        ),
        (
            ["model.pipeline.grpo.updates_per_rollout=2", "training.train_iters=21"],
            "training.train_iters",
            "resumes only at a rollout step",
        ),
    ],
)
def test_a_grpo_run_that_cannot_train_is_refused_naming_the_key(tiny, overrides, path, words):
    err = _refused(tiny, *overrides)
    assert path in err.paths, str(err)
    assert words in str(err)


class _Expert(torch.nn.Module):
    """A velocity of latents and text that records the timesteps it is called at."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv3d(4, 4, kernel_size=1)
        self.timesteps: list[float] = []

    def forward(self, hidden, timestep, text):
        self.timesteps += timestep.tolist()
        return self.conv(hidden) + text.mean(dim=(1, 2))[:, None, None, None, None]


@pytest.mark.parametrize(
    ("method", "phase", "trained_forwards"), [("FlowGRPO", "grpo", 1), ("DiffusionNFT", "nft", 2)]
)
def test_with_both_experts_each_rollout_step_and_each_trained_step_runs_the_expert_of_its_timestep(
    method, phase, trained_forwards
):
    """Wan2.2 A14B, Flow-GRPO and DiffusionNFT: the rollout's steps (Flow-GRPO: their log-probabilities;
    DiffusionNFT: the old policy's, and its ``v_old`` at the trained sigma) and the trained steps' gradients
    come from the high-noise expert at timesteps at or above the boundary and from the low-noise one below."""
    import mm_pipelines
    from mm_pipelines import SampleRNG
    from wan22_train.pipeline import Wan22Pipeline

    torch.manual_seed(0)
    container = torch.nn.Module()
    container.predictor, container.predictor_low = _Expert(), _Expert()
    base = Wan22Pipeline.from_options({"expert": "both"})
    grpo = getattr(mm_pipelines, method)(
        base, group_size=2, sampling_steps=4, timestep_fraction=0.25, kl_weight=0
    )
    grpo.scorer = lambda latents, prompts, groups, names: (latents.double().flatten(1).mean(1), {})
    boundary = base.boundary_timestep()
    high = [k for k in range(4) if float(grpo.sigmas[k]) * 1000 >= boundary]
    assert 0 < len(high) < 4, "the schedule has steps of both experts"
    batch = {"latents": torch.zeros(1, 4, 2, 2, 2), "prompt_embeds": torch.randn(1, 3, 5)}
    seen = set()
    for step in range(6):
        rng = SampleRNG(seed=0, step=step, sample_ids=[0])
        (k,) = grpo.train_steps(rng)
        for expert in (container.predictor, container.predictor_low):
            expert.timesteps.clear()
        grpo(container, rng=rng, phase=phase, **batch).loss.backward()
        trained, other = (
            (container.predictor, container.predictor_low)
            if k in high
            else (container.predictor_low, container.predictor)
        )
        assert trained.conv.weight.grad is not None and other.conv.weight.grad is None, f"step {k}"
        assert all(t >= boundary for t in container.predictor.timesteps)
        assert all(t < boundary for t in container.predictor_low.timesteps)
        # the rollout, then the trained step's forwards: 2 clips each
        assert len(container.predictor.timesteps) == 2 * len(high) + (
            2 * trained_forwards if k in high else 0
        )
        container.zero_grad(set_to_none=True)
        seen.add(k in high)
    assert seen == {True, False}


def test_a_ti2v_grpo_step_gives_the_wan_predictor_the_clean_first_frame_at_timestep_0_at_every_call():
    """Wan2.2 TI2V-5B through ``Wan22Pipeline``: each rollout and trained step's forward sees the prompt's
    clean first latent frame with per-token timestep 0 on its tokens (the rest at the step's sigma), and the
    loss trains the predictor."""
    from mm_pipelines import FlowGRPO, SampleRNG
    from wan22_train.model import WanDiT, WanDiTConfig
    from wan22_train.pipeline import Wan22Pipeline

    torch.manual_seed(0)
    container = torch.nn.Module()
    container.predictor = WanDiT(WanDiTConfig(model_type="ti2v", in_dim=4, out_dim=4, dim=32, ffn_dim=64,
                                              num_heads=2, num_layers=1, text_dim=8, freq_dim=16))  # fmt: skip
    grpo = FlowGRPO(Wan22Pipeline.from_options({"task": "ti2v"}), group_size=2, sampling_steps=3, kl_weight=0)
    grpo.scorer = lambda latents, prompts, groups, names: (latents.double().flatten(1).mean(1), {})
    calls = []
    container.predictor.register_forward_pre_hook(
        lambda _, args: calls.append((args[0].clone(), args[1].clone()))
    )
    latents = torch.randn(1, 4, 3, 4, 6)
    out = grpo(container, rng=SampleRNG(seed=0, step=0, sample_ids=[0]), phase="grpo", latents=latents,
               prompt_embeds=torch.randn(1, 3, 8))  # fmt: skip
    out.loss.backward()
    per_frame = (4 // 2) * (6 // 2)
    assert len(calls) == 3 + grpo.trained_steps
    for hidden, timestep in calls:
        torch.testing.assert_close(
            hidden[:, :, :1], latents[:, :, :1].expand(2, -1, -1, -1, -1), rtol=0, atol=0
        )
        assert torch.all(timestep[:, :per_frame] == 0) and torch.all(timestep[:, per_frame:] > 0)
    assert container.predictor.blocks[0].self_attn.q.weight.grad.abs().sum() > 0
