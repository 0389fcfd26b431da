"""What the online reward fine-tunings (Flow-GRPO, DiffusionNFT) share: ``G`` clips per prompt whose draws are
keyed by (seed, optimizer step, the prompt's global sample index, group index ``g``) through ``SampleRNG``,
the clips' prompt texts and names for the scorer, the step's keyed subset of the sampler's steps to train on,
and the checks that a call runs in its phase with a scorer attached.

Clip ``b * G + g`` of a micro-batch of ``B`` prompts is prompt ``b``'s clip ``g``: a prompt's clips are the
same whichever micro-batch (rank) holds the prompt.

**Streams.** The rollouts act on the base pipeline's flow state (``state_streams``, ``clean_state``,
``state_velocity``: :class:`~mm_pipelines.distribution_matching.FlowState`): Wan's one stream ``latents``,
LTX-2's ``video`` and ``audio``. A clip's draws for the first stream use the bare purpose (``grpo_start_<g>``:
Wan's keys, and so its clips, are those of the one-stream code), each further stream's the purpose with
``_<stream>`` appended (``grpo_start_audio_<g>``) (:func:`stream_noise`). Each prompt's conditions are
repeated for its ``G`` clips generically (:func:`repeat_conditions`: every per-sample tensor of
``prepare_conditions``), and the scorer gets the clips' latents from the base's ``scored_latents(state,
conditions)`` when it has one (LTX-2: the video's latents ``[N, C, F, H, W]``), else the one stream.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import torch

from .flow_match_scheduler import FlowMatchScheduler
from .keyed_random import SampleRNG


class SampleScorer(Protocol):
    """What scores the rollouts (attached by the trainer from ``training.rewards``). A scorer whose
    ``needs_audio`` is true is also given the clips' audio latents (``audio=``: the base's
    ``scored_audio(state, conditions)``, LTX-2's)."""

    def __call__(
        self, latents: torch.Tensor, prompts: Sequence[str], *, groups: Sequence[int], names: Sequence[str]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Each clip's reward ``[N]`` (float64; NaN for a dropped clip) from its latents ``[N, ...]`` and
        prompt, and the statistics to log."""
        ...


def score_clips(
    scorer: Any, base: Any, state: Mapping[str, torch.Tensor], conditions: Mapping[str, Any],
    prompts: Sequence[str], *, groups: Sequence[int], names: Sequence[str],
) -> tuple[torch.Tensor, dict[str, float]]:  # fmt: skip
    """``scorer``'s rewards and statistics of the clips' clean ``state``: their :func:`scored_latents` and,
    for a scorer that ``needs_audio``, the base's ``scored_audio(state, conditions)``.

    Raises:
        ValueError: a scorer that needs audio on a base without ``scored_audio``.
    """
    extra = {}
    if getattr(scorer, "needs_audio", False):
        audio = getattr(base, "scored_audio", None)
        if not callable(audio):
            raise ValueError(
                f"training.rewards score audio, and {type(base).__name__} rolls out none (no scored_audio)"
            )
        extra["audio"] = audio(state, conditions)
    latents = scored_latents(base, state, conditions)
    return scorer(latents, prompts, groups=groups, names=names, **extra)


def rollout_sigmas(grid: FlowMatchScheduler, steps: int, shift: float | None) -> torch.Tensor:
    """``[steps + 1]`` float64: the rollouts' sampler sigmas, decreasing to 0, on the training ``grid``'s
    scheduler settings with ``steps`` steps at the time ``shift`` (None: the grid's)."""
    schedule = FlowMatchScheduler(
        num_train_timesteps=grid.num_train_timesteps, shift=grid.shift, sigma_min=grid.sigma_min,
        sigma_max=grid.sigma_max, extra_one_step=grid.extra_one_step,
    )  # fmt: skip
    schedule.set_inference_timesteps(steps, shift=shift)
    assert schedule.inference_sigmas is not None
    return schedule.inference_sigmas.double()


def group_noise(
    rng: SampleRNG, purpose: str, groups: int, shape: Sequence[int], device: torch.device | str
) -> torch.Tensor:
    """``[B * G, *shape]`` standard normal: clip ``b * G + g`` drawn from (prompt ``b``'s key, ``purpose_g``)."""
    draws = [rng.randn(f"{purpose}_{g}", tuple(shape), device=device) for g in range(groups)]
    return torch.stack(draws, dim=1).flatten(0, 1)


def stream_noise(
    rng: SampleRNG, purpose: str, groups: int, shapes: Mapping[str, Sequence[int]], device: torch.device | str
) -> dict[str, torch.Tensor]:
    """:func:`group_noise` of each stream of ``shapes`` (``{stream: shape}``, the first stream first): the
    first under ``purpose``, each further one under ``purpose_<stream>`` (module docstring)."""
    return {
        name: group_noise(rng, purpose if i == 0 else f"{purpose}_{name}", groups, shape, device)
        for i, (name, shape) in enumerate(shapes.items())
    }


def repeat_conditions(
    conditions: Mapping[str, Any], size: int, groups: int, skip: Sequence[str] = ()
) -> dict[str, Any]:
    """Each clip's conditions (clip ``b * G + g``: prompt ``b``'s) from the ``size`` prompts' ``conditions``
    (``prepare_conditions``): every tensor whose first dimension is the prompts' ``size`` is per-sample and
    repeated ``groups`` times along it; anything else (a latent grid, a frame rate, a shared tensor) is the
    same for every clip and kept. The keys of ``skip`` (the clean flow state, which the rollout replaces)
    are left out."""
    out: dict[str, Any] = {}
    for key, value in conditions.items():
        if key in skip:
            continue
        if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
            raise ValueError(
                f"rollouts need stacked micro-batches of one shape: the condition {key!r} is a packed list"
            )
        per_sample = isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == size
        out[key] = value.repeat_interleave(groups, dim=0) if per_sample else value
    return out


def clean_flow(base: Any, conditions: Mapping[str, Any], mode: str) -> dict[str, torch.Tensor]:
    """The prompts' clean flow state (``base.clean_state``: one tensor per stream, their first dimension the
    prompts), refusing packed micro-batches (a list per sample)."""
    state = base.clean_state(conditions)
    if any(isinstance(x, (list, tuple)) for x in state.values()):
        raise ValueError(f"{mode} rolls out stacked micro-batches of one shape, not packed ones")
    return dict(state)


def scored_latents(
    base: Any, state: Mapping[str, torch.Tensor], conditions: Mapping[str, Any]
) -> torch.Tensor:
    """What the scorer gets of the clips' clean ``state``: the base's ``scored_latents(state, conditions)``
    when it has one (LTX-2: the video's latents), else the state's one stream.

    Raises:
        ValueError: a state of several streams and a base without ``scored_latents``.
    """
    scored = getattr(base, "scored_latents", None)
    if callable(scored):
        return scored(state, conditions)
    if len(state) != 1:
        raise ValueError(
            f"{type(base).__name__}'s flow state has the streams {list(state)}: the rewards need its "
            "scored_latents(state, conditions) to know which latents to score"
        )
    return next(iter(state.values()))


def state_device(conditions: Mapping[str, Any]) -> torch.device:
    """The device of the first tensor of ``conditions`` (where the rollouts' noise is drawn)."""
    return next(v.device for v in conditions.values() if isinstance(v, torch.Tensor))


def keyed_steps(rng: SampleRNG, purpose: str, count: int, total: int) -> list[int]:
    """``count`` of the ``total`` sampler steps, sorted, drawn from the optimizer step's key alone (every
    clip, micro-batch and rank of the step trains the same steps: with both A14B experts, the same expert)."""
    order = torch.randperm(total, generator=rng.step_generator(purpose, "cpu"))
    return sorted(order[:count].tolist())


def clip_prompts(batch: Mapping[str, Any], rng: SampleRNG, groups: int) -> list[str]:
    """Each clip's prompt text: the batch's ``prompt`` when it has one, else ``sample <global index>``."""
    texts = batch.get("prompt")
    if not isinstance(texts, (list, tuple)) or len(texts) != len(rng):
        texts = [f"sample {i}" for i in rng.sample_ids]
    return [str(t) for t in texts for _ in range(groups)]


def clip_names(rng: SampleRNG, groups: int) -> list[str]:
    """Each clip's name in a reward's error message: ``step <n> sample <global index> clip <g>``."""
    return [f"step {rng.step} sample {i} clip {g}" for i in rng.sample_ids for g in range(groups)]


def clip_groups(size: int, groups: int) -> list[int]:
    """Each clip's prompt within the micro-batch (the scorer's groups, for groupwise rewards)."""
    return [i for i in range(size) for _ in range(groups)]


def check_call(mode: str, phase: str, got: str | None, scorer: SampleScorer | None) -> None:
    """Refuse a call outside the mode's ``phase`` or without the scorer of ``training.rewards``."""
    if got != phase:
        raise ValueError(
            f"{mode}: model(**batch, phase=...) runs in the phase {phase!r}; set training.phases: "
            f"{{{phase}: {{submodels: [<the policy's sub-models>]}}}} (got phase {got!r})"
        )
    if scorer is None:
        raise ValueError(f"{mode} scores its rollouts with training.rewards: none were attached (scorer)")


__all__ = [
    "SampleScorer",
    "check_call",
    "clip_groups",
    "clip_names",
    "clean_flow",
    "clip_prompts",
    "group_noise",
    "keyed_steps",
    "repeat_conditions",
    "rollout_sigmas",
    "score_clips",
    "scored_latents",
    "state_device",
    "stream_noise",
]
