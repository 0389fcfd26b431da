"""A tiny setting where few-step sampling blends and distillation can be measured (benchmarks/
wan_distill_quality.py), and a smaller one without a fitted teacher for the tests
(tests/test_wan_distill_quality.py, tests/test_wan_distill_one_step.py).

Pre-encoded latents, no VAE; PSNR in latent space (values +-0.8, peak-to-peak 2): two captions, each
covering two different clips of 4 x 1 x 4 x 4 latents (differing in one 2 x 2 block of one channel:
``DIFFERING``). The predictor (WanDiT, patch 1 x 2 x 2: 4 tokens
per clip, 64 wide, 2 layers) is fitted to the exact flow-match velocity of that data, the posterior-mean
velocity ``(x_t - E[x0 | x_t, caption]) / sigma``, so a good teacher takes a minute, not a long training.
The check (:func:`passes`), over 16 seeds per caption: every sample is >= 25 dB from one of its
caption's clips and >= 3 dB closer to it than to the average of those clips (sharp, not a blend), and
both clips of each caption appear (no collapse).

The exact setting (:func:`exact_setting`, the tests): no fitting. The clips' differing block is at +-0.5
(``EXACT_AMPLITUDE``: the clips 18 dB apart, their average 24 dB from each) and each clip is the mean of a
Gaussian of std ``SPREAD`` per value; the teacher is that mixture's exact velocity
(:class:`ExactVelocity`). Without the spread an exact teacher passes at 4 steps: its last step, from
sigma 0.003, snaps to the nearer clip, where a network (or the spread) keeps the blend it reached; at
+-0.8 its 4 steps blend on 6% of fresh noises but none of the check's 32. The student and the critic
(:class:`TiltedVelocity`) are the teacher with a small network whose output layer starts at zero (both
equal the teacher exactly at the start, as DMD2 initialises them): per noise level and caption, it sets
the temperature and a per-clip bias of the posterior over the caption's clips (how sharply, and towards
which clip, a clean estimate commits). The tests so check the direction in which distillation drives a
student (sharper, with both clips kept), not how steep a network gets in a given number of steps, which
the benchmark measures. The check is the same; the recipes ``EXACT_FOUR_STEP`` and ``EXACT_ONE_STEP``
take seconds on one thread.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import torch
from mm_pipelines import DistributionMatchingDistillation, FlowMatchScheduler, SampleRNG
from mm_trainer import ParameterEMA
from torch import nn

from wan22_train.container import Wan22Container
from wan22_train.model import WanDiT, WanDiTConfig
from wan22_train.pipeline import Wan22Pipeline

SHAPE = (4, 1, 4, 4)  # latent channels, frames, height, width
# the two clips of a caption differ in this many of their 16 block values (one 2 x 2 block of one channel:
# 4 of 64 latent values, 14 dB apart, their average 20 dB from each); a 1-step student's split between
# them is sharper the nearer they are (benchmarks/README.md: with ~8 it failed on 2-3% of noises)
DIFFERING = 1
TEXT = (2, 32)  # caption tokens, text width
OWNER = torch.tensor([0, 0, 1, 1])  # caption of each clip
PREDICTOR = WanDiTConfig(
    patch_size=(1, 2, 2), in_dim=4, out_dim=4, dim=64, ffn_dim=128, num_heads=4, num_layers=2, text_dim=32,
    freq_dim=32, text_len=2, rope_max_seq_len=64,
)  # fmt: skip
SHIFT, STUDENT_SHIFT = 3.0, 1.0
# 6000 fitting steps: the teacher's 50 steps fail the check's criterion on 0.05% of fresh noises (1500 steps:
# 1.5%), so the check's reference is precise and a distilled student's precision is its own
FIT_STEPS, FIT_LR, FIT_BATCH = 6000, 3e-3, 32
GENERATOR_LR, CRITIC_LR, BATCH = 3e-4, 1e-3, 64
# the check: a sample this close to a clip, and this much closer than to the blend
SHARP_DB, LEAD_DB = 25.0, 3.0
# the exact setting: the differing block at +-0.5 (the clips 18 dB apart, their average 24 dB from each: a blend
# fails both criteria), each clip the mean of a Gaussian of this std per value (its samples ~40 dB from it)
EXACT_AMPLITUDE, SPREAD = 0.5, 0.02
# the exact setting's student and critic: 149 parameters each, trained at this rate (both phases)
EXACT_LR = 1e-2


@dataclass(frozen=True)
class Recipe:
    """What a distillation of the toy sets (the config keys in parentheses)."""

    student_steps: int = 4  # distill.student_steps
    student_sigma_max: float = 1.0  # distill.student_sigma_max
    dm_range: tuple[float, float] = (0.02, 0.98)  # distill.dm_range
    generator_every: int = 2  # training.phases: the generator phase's cadence; the critic every step
    steps: int = 3200  # training.max_steps
    ema_decay: float = 0.999  # training.ema.decay: the student checked is that average, updated every step


FOUR_STEP = Recipe()
# A 1-step student must turn noise into one clip or the other by itself: it starts at sigma 0.3 from 0.3 x the
# noise, where the teacher's denoiser already splits the noise between the clips (SiD's sigma_init); the
# distribution matching at sigma 0.015-0.75 (dm_range [0.5, 0.995]: the low noise that tells samples apart
# precisely, without the high noise that blurs them); the generator every 2nd step; 12000 steps: the check
# passed at every look from 4000 to 16000 steps (2 seeds), the share of fresh noises failing falls from
# ~3% at 4000 to ~1% at 12000 (benchmarks/wan_distill_quality.py --one-step; benchmarks/README.md)
ONE_STEP = Recipe(
    student_steps=1, student_sigma_max=0.3, dm_range=(0.5, 0.995), generator_every=2, steps=12000
)
# The exact setting's recipes (the tests): the same schedules, distribution-matching ranges and cadence,
# a few hundred steps and an EMA of decay 0.99 (about the last 100 steps; at 0.999 the average would still
# be mostly the teacher)
EXACT_FOUR_STEP = replace(FOUR_STEP, steps=400, ema_decay=0.99)
EXACT_ONE_STEP = replace(ONE_STEP, steps=800, ema_decay=0.99)


def data() -> tuple[torch.Tensor, torch.Tensor]:
    """Four clips (2 x 2 blocks of +-0.8 per channel: 16 block values each) and two caption embeddings;
    the second clip of each caption is its first with ``DIFFERING`` block values flipped."""
    g = torch.Generator().manual_seed(1)
    c, t, h, w = SHAPE
    blocks = torch.randint(0, 2, (4, c, t, h // 2, w // 2), generator=g).float() * 1.6 - 0.8
    captions = torch.randn(2, *TEXT, generator=g)
    flips = torch.Generator().manual_seed(101)
    for first in (0, 2):
        values = blocks[first].flatten().clone()
        chosen = torch.randperm(values.numel(), generator=flips)[:DIFFERING]
        values[chosen] = -values[chosen]
        blocks[first + 1] = values.view_as(blocks[first])
    return blocks.repeat_interleave(2, 3).repeat_interleave(2, 4), captions


def ideal_velocity(
    clips: torch.Tensor, x_t: torch.Tensor, sigma: torch.Tensor, caption: torch.Tensor
) -> torch.Tensor:
    """``(x_t - E[x0 | x_t, caption]) / sigma``: the flow-match velocity of the clips themselves."""
    view = (-1, 1, 1, 1, 1)
    dist = (x_t[:, None] - (1 - sigma).view(-1, 1, 1, 1, 1, 1) * clips[None]).pow(2).flatten(2).sum(2)
    logits = (-dist / (2 * sigma[:, None] ** 2)).masked_fill(OWNER[None] != caption[:, None], -math.inf)
    x0 = torch.einsum("bk,k...->b...", logits.softmax(1), clips)
    return (x_t - x0) / sigma.view(view)


def exact_data() -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`data` with each caption's differing block values at +-``EXACT_AMPLITUDE`` (were +-0.8)."""
    clips, captions = data()
    differ = (clips[0::2] != clips[1::2]).repeat_interleave(2, 0)
    return torch.where(differ, clips * (EXACT_AMPLITUDE / 0.8), clips), captions


def mixture_velocity(
    clips: torch.Tensor, x_t: torch.Tensor, sigma: torch.Tensor, caption: torch.Tensor, spread: float,
    tilt: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:  # fmt: skip
    """``(x_t - E[x0 | x_t, caption]) / sigma`` for clean clips drawn as ``clips[k] + spread * N(0, I)``,
    ``k`` uniform over the caption's clips: the exact flow-match velocity of that mixture. ``tilt``
    (a log temperature ``[B]`` and a logit bias ``[B, clips]``) reshapes the posterior over the clips:
    ``logits / temperature + bias``."""
    s = sigma.view(-1, 1, 1, 1, 1, 1)
    variance = (1 - s) ** 2 * spread**2 + s**2  # of x_t per value, given the clip
    offset = x_t[:, None] - (1 - s) * clips[None]
    logits = -offset.pow(2).flatten(2).sum(2) / (2 * variance.view(-1, 1))
    if tilt is not None:
        log_temperature, bias = tilt
        logits = logits * torch.exp(-log_temperature)[:, None] + bias
    logits = logits.masked_fill(OWNER[None] != caption[:, None], -math.inf)
    x0 = torch.einsum(
        "bk,bk...->b...", logits.softmax(1), clips[None] + (1 - s) * spread**2 / variance * offset
    )
    return (x_t - x0) / sigma.view(-1, 1, 1, 1, 1)


class ExactVelocity(nn.Module):
    """The exact setting's teacher: :func:`mixture_velocity` with WanDiT's forward signature
    ``(hidden_states, timestep, encoder_hidden_states)``: sigma is ``timestep / 1000`` and the caption the
    one whose embedding ``encoder_hidden_states`` is."""

    def __init__(self, clips: torch.Tensor, captions: torch.Tensor, spread: float = SPREAD) -> None:
        super().__init__()
        self.spread = spread
        self.register_buffer("clips", clips.clone(), persistent=False)
        self.register_buffer("captions", captions.clone(), persistent=False)

    def caption(self, encoder_hidden_states: torch.Tensor) -> torch.Tensor:
        """The index of the caption of each embedding ``[B, tokens, width]``."""
        distance = (encoder_hidden_states.float()[:, None] - self.captions[None]).pow(2).flatten(2).sum(2)
        return distance.argmin(1)

    def forward(
        self, hidden_states: torch.Tensor, timestep: torch.Tensor, encoder_hidden_states: torch.Tensor,
        tilt: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:  # fmt: skip
        sigma = timestep.float() / 1000
        caption = self.caption(encoder_hidden_states)
        return mixture_velocity(self.clips, hidden_states.float(), sigma, caption, self.spread, tilt)


class TiltedVelocity(nn.Module):
    """The exact setting's student and critic: ``exact``'s velocity with its posterior over the caption's
    clips tilted by a small network (``tilt``: from the log sigma and the caption, 16 wide, a log
    temperature and a logit bias per clip), so that a clean estimate can commit more or less sharply to
    a clip, and lean to one clip (as far as every noise to one: a collapse). Its output layer starts at
    zero: at the start it is ``exact``, bit for bit."""

    def __init__(self, exact: ExactVelocity) -> None:
        super().__init__()
        self.exact = exact
        clips, captions = exact.clips.shape[0], exact.captions.shape[0]
        self.tilt = nn.Sequential(nn.Linear(1 + captions, 16), nn.SiLU(), nn.Linear(16, 1 + clips))
        nn.init.zeros_(self.tilt[-1].weight)
        nn.init.zeros_(self.tilt[-1].bias)

    def forward(
        self, hidden_states: torch.Tensor, timestep: torch.Tensor, encoder_hidden_states: torch.Tensor
    ) -> torch.Tensor:
        sigma = timestep.float() / 1000
        caption = self.exact.caption(encoder_hidden_states)
        one_hot = nn.functional.one_hot(caption, self.exact.captions.shape[0]).float()
        tilt = self.tilt(torch.cat([sigma.log()[:, None], one_hot], 1))
        return self.exact(hidden_states, timestep, encoder_hidden_states, tilt=(tilt[:, 0], tilt[:, 1:]))


def exact_setting() -> dict[str, Any]:
    """The exact setting: clips, captions, the teacher (:class:`ExactVelocity`), the start of the student
    and the critic (:class:`TiltedVelocity`, its network initialised from seed 0), the clips' ``spread``
    (:func:`distil` draws its batches' latents from the mixture) and the learning rates."""
    clips, captions = exact_data()
    teacher = ExactVelocity(clips, captions).requires_grad_(False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        start = TiltedVelocity(teacher)
    return {
        "clips": clips, "captions": captions, "teacher": teacher, "student": start, "spread": SPREAD,
        "lr": {"generator": EXACT_LR, "critic": EXACT_LR},
    }  # fmt: skip


@contextmanager
def one_thread() -> Iterator[None]:
    """Torch on one thread inside: the same floating-point sums whatever the machine's load."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def fit_teacher() -> dict[str, Any]:
    """The clips, captions and the teacher fitted to their exact velocity (one thread: the same numbers
    on any machine load)."""
    with one_thread():
        return _fit_teacher()


def _fit_teacher() -> dict[str, Any]:
    torch.manual_seed(0)
    clips, captions = data()
    teacher = WanDiT(PREDICTOR)
    teacher.init_weights()
    grid, g = FlowMatchScheduler(shift=SHIFT), torch.Generator().manual_seed(5)
    optimizer = torch.optim.AdamW(teacher.parameters(), lr=FIT_LR, weight_decay=0)
    for step in range(FIT_STEPS):
        caption = torch.randint(0, 2, (FIT_BATCH,), generator=g)
        clip = caption * 2 + torch.randint(0, 2, (FIT_BATCH,), generator=g)
        sigma = grid.sigmas[torch.randint(0, 1000, (FIT_BATCH,), generator=g)]
        noise = torch.randn(FIT_BATCH, *SHAPE, generator=g)
        x_t = FlowMatchScheduler.add_noise(clips[clip], noise, sigma)
        loss = (
            (teacher(x_t, sigma * 1000, captions[caption]) - ideal_velocity(clips, x_t, sigma, caption))
            .pow(2)
            .mean()
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        for group in optimizer.param_groups:
            group["lr"] = FIT_LR * 0.5 * (1 + math.cos(math.pi * step / FIT_STEPS))
    return {"clips": clips, "captions": captions, "teacher": teacher.requires_grad_(False)}


def distillation(
    setting: dict, generator_loss: str = "distribution_matching", recipe: Recipe = FOUR_STEP
) -> tuple[Wan22Container, DistributionMatchingDistillation]:
    """A container with the teacher, a student and a critic (both copies of the teacher, or of the setting's
    ``student`` where it has one) and its DMD2 pipeline for ``recipe``'s student schedule and
    distribution-matching range."""
    teacher = setting["teacher"]
    dmd = DistributionMatchingDistillation(
        Wan22Pipeline.from_options({"shift": SHIFT}), student_steps=recipe.student_steps,
        student_shift=STUDENT_SHIFT, student_sigma_max=recipe.student_sigma_max, dm_range=recipe.dm_range,
        generator_loss=generator_loss,
    )  # fmt: skip
    student, critic = (copy.deepcopy(setting.get("student", teacher)).requires_grad_(True) for _ in range(2))
    models = {"predictor": student, "teacher": teacher, "critic": critic}
    return Wan22Container(models, trainable=("predictor", "critic"), pipeline=dmd), dmd


def distil(
    setting: dict,
    generator_loss: str = "distribution_matching",
    recipe: Recipe = FOUR_STEP,
    seed: int = 0,
    after_step: Callable[[int, Callable[[], Wan22Container], DistributionMatchingDistillation], None]
    | None = None,
) -> tuple[Wan22Container, DistributionMatchingDistillation]:
    """``recipe.steps`` steps of the two phases in turn, as ``training.phases`` runs them: the critic every
    step, the generator every ``recipe.generator_every``-th (AdamW with beta1 0 for both, as DMD2), and the
    student's EMA updated after every step as ``training.ema`` does. Returns the container with the
    averaged student in place of the last one. ``after_step(steps done, averaged, pipeline)`` runs after
    each step, ``averaged()`` building that container for the average so far (the benchmark's look at
    intermediate students). A setting with a ``spread`` draws each step's latents from its mixture (keyed
    by the step), and one with ``lr`` sets the phases' learning rates (default ``GENERATOR_LR``,
    ``CRITIC_LR``)."""
    container, dmd = distillation(setting, generator_loss, recipe)
    lr = setting.get("lr", {"generator": GENERATOR_LR, "critic": CRITIC_LR})
    optimizers = {
        "critic": torch.optim.AdamW(container.critic.parameters(), lr=lr["critic"], betas=(0.0, 0.999), weight_decay=0),
        "generator": torch.optim.AdamW(container.predictor.parameters(), lr=lr["generator"], betas=(0.0, 0.999), weight_decay=0),
    }  # fmt: skip
    average = ParameterEMA(container.predictor, decay=recipe.ema_decay)
    clips, captions = setting["clips"], setting["captions"]
    index = torch.arange(BATCH) % 4
    batch = {"latents": clips[index], "prompt_embeds": captions[OWNER[index]]}
    spread = setting.get("spread", 0.0)
    for step in range(recipe.steps):
        rng = SampleRNG(seed=seed, step=step, sample_ids=list(range(step * BATCH, (step + 1) * BATCH)))
        if spread:
            batch["latents"] = clips[index] + spread * rng.randn("toy_data", SHAPE)
        generator_due = step % recipe.generator_every == 0
        if generator_loss == "flow_matching":
            due = ["generator"] * generator_due  # the same generator updates, without a critic to train
        else:
            due = ["critic"] + ["generator"] * generator_due
        for phase in due:
            container(**batch, rng=rng, phase=phase).loss.backward()
            optimizers[phase].step()
            container.zero_grad(set_to_none=True)
        average.update()
        if after_step is not None:
            after_step(step + 1, lambda: averaged(container, average), dmd)
    return averaged(container, average), dmd


def averaged(container: Wan22Container, average: ParameterEMA) -> Wan22Container:
    """``container`` with its student replaced by a copy holding ``average``'s weights."""
    student = copy.deepcopy(container.predictor)
    student.load_state_dict(average.state_dict())
    models = {"predictor": student, "teacher": container.teacher, "critic": container.critic}
    return Wan22Container(models, trainable=("predictor", "critic"), pipeline=container.pipeline)


def psnr(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-sample PSNR in dB, peak-to-peak 2."""
    return 10 * torch.log10(4.0 / (a - b).pow(2).flatten(1).mean(1))


def quality(
    setting: dict, container: Wan22Container, dmd: DistributionMatchingDistillation, role: str, steps: int
) -> dict:
    """The check over 16 seeds per caption: the worst sample's PSNR to its nearest own clip, its worst margin
    over the clips' average, how many samples each clip got, and how many of the 32 are sharp. Up to 4
    steps on ``dmd``'s student schedule; more on the teacher's own (from pure noise at its shift)."""
    worst, margin, counts, sharp = math.inf, math.inf, [], 0
    for caption in range(2):
        noise = torch.randn(16, *SHAPE, generator=torch.Generator().manual_seed(100 + caption))
        best, lead, which = _judge(
            setting, _draw(setting, container, dmd, role, steps, noise, caption), caption
        )
        worst, margin = min(worst, float(best.min())), min(margin, float(lead.min()))
        counts += which.bincount(minlength=2).tolist()
        sharp += int(_sharp(best, lead).sum())
    return {"worst_db": worst, "margin_db": margin, "clips_drawn": counts, "sharp": sharp}


def fresh_check(
    setting: dict, container: Wan22Container, dmd: DistributionMatchingDistillation, role: str, steps: int = 1
) -> dict:
    """The check beyond its 32 samples, on 2048 fresh noises (1024 per caption): ``fail_share``, the share
    whose sample is not sharp, and ``draws_passing``, how many of 64 disjoint draws of 32 (16 per caption,
    as the check takes them) pass it; at a share ``p`` about ``64 (1 - p)^32`` do, if failures fall anywhere."""
    sharp, both = [], []
    for caption in range(2):
        noise = torch.randn(1024, *SHAPE, generator=torch.Generator().manual_seed(1000 + caption))
        best, lead, which = _judge(
            setting, _draw(setting, container, dmd, role, steps, noise, caption), caption
        )
        sharp.append(_sharp(best, lead).view(64, 16))
        which = which.view(64, 16)
        both.append((which == 0).any(1) & (which == 1).any(1))
    draws = sharp[0].all(1) & sharp[1].all(1) & both[0] & both[1]
    return {"fail_share": 1 - float(torch.cat(sharp).float().mean()), "draws_passing": int(draws.sum())}


def _draw(
    setting: dict, container: Wan22Container, dmd: DistributionMatchingDistillation, role: str, steps: int,
    noise: torch.Tensor, caption: int,
) -> torch.Tensor:  # fmt: skip
    if steps > 4:  # the teacher's many steps: its own grid and shift, from pure noise
        grid = FlowMatchScheduler(shift=SHIFT)
        grid.set_inference_timesteps(steps)
        sigmas = grid.inference_sigmas
    else:
        sigmas = dmd.student_sigmas(steps)
    text = {"prompt_embeds": setting["captions"][caption : caption + 1].expand(len(noise), -1, -1)}
    return dmd.sample(container, noise, text, role=role, sigmas=sigmas)


def _judge(setting: dict, x: torch.Tensor, caption: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per sample: the PSNR to the nearest clip of ``caption``, its lead over the clips' average, and which."""
    own = setting["clips"][OWNER == caption]
    best, which = torch.stack([psnr(x, clip.expand_as(x)) for clip in own]).max(0)
    return best, best - psnr(x, own.mean(0).expand_as(x)), which


def _sharp(best: torch.Tensor, lead: torch.Tensor) -> torch.Tensor:
    """Per sample, the check's criterion: this close to a clip, and this much closer than to the blend."""
    return (best >= SHARP_DB) & (lead >= LEAD_DB)


def passes(result: dict) -> bool:
    """The check: sharp (>= 25 dB to a clip, >= 3 dB over the clips' average) and no clip missing."""
    return (
        result["worst_db"] >= SHARP_DB and result["margin_db"] >= LEAD_DB and min(result["clips_drawn"]) > 0
    )


__all__ = [
    "EXACT_FOUR_STEP", "EXACT_ONE_STEP", "FOUR_STEP", "ONE_STEP", "ExactVelocity", "Recipe", "TiltedVelocity", "averaged", "data",
    "distil", "distillation", "exact_data", "exact_setting", "fit_teacher", "fresh_check", "ideal_velocity", "mixture_velocity",
    "one_thread", "passes", "psnr", "quality",
]  # fmt: skip
