"""What few-step distillation (DMD2) adds on the tiny two-clips-per-caption setting
(:mod:`wan22_train.distill_toy`): the quality check and the sampling time of the teacher at 1, 4 and 50
steps, of DMD2 students at 1 and 4 steps (critic every step on batches of 64, generator every 2nd,
4-step schedule at shift 1; checked: the student's EMA, decay 0.999, as ``training.ema`` keeps it), and
of students trained with the flow-matching loss in place of the distribution-matching term (the same
schedule, generator updates and EMA), each with the share of 2048 fresh noises (not the check's 32) whose
sample fails the check and how many of 64 disjoint draws of 32 from them pass it (``fresh_check``). All
in one process, one thread. Then the DMD2 students' 4-step check and fresh-noise share every
``--probe-every`` distillation steps from ``--probe-from`` on (the same runs): whether passing is a
property of the training or of the step it stopped at. With ``--one-step N``, students distilled for
the 1-step schedule (``distill_toy.ONE_STEP``: from 0.3 x the noise at sigma 0.3, the distribution
matching at sigma <= 0.75, the generator every 2nd step; N steps), the teacher's 1-step check on that
schedule, and the students' 1-step check every ``--one-step-probe-every`` steps with the
fresh-noise columns (about half a minute per 1000 steps: off by default).

    hatch run python benchmarks/wan_distill_quality.py [--seeds 0 1] [--steps 3200] [--probe-every 400]
        [--one-step [8000] --one-step-probe-every 2000]
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch
from wan22_train.distill_toy import (
    FOUR_STEP,
    ONE_STEP,
    SHAPE,
    distil,
    distillation,
    fit_teacher,
    fresh_check,
    passes,
    quality,
)


def checked(setting: dict, container, dmd, role: str, steps: int) -> dict:
    """:func:`quality` on the check's 32 noises and :func:`fresh_check` on 2048 fresh ones, in one dict."""
    return {
        **quality(setting, container, dmd, role, steps),
        **fresh_check(setting, container, dmd, role, steps),
    }


def timed_quality(setting: dict, container, dmd, role: str, steps: int) -> dict:
    """:func:`checked` and the median wall time of 5 samplings of a 16-sample batch."""
    text = {"prompt_embeds": setting["captions"][:1].expand(16, -1, -1)}
    times = []
    for _ in range(5):
        started = time.perf_counter()
        dmd.sample(container, torch.randn(16, *SHAPE), text, role=role, num_steps=steps)
        times.append(1000 * (time.perf_counter() - started))
    return {**checked(setting, container, dmd, role, steps), "ms": sorted(times)[2]}


def row(name: str, steps: int, result: dict) -> str:
    counts = "/".join(str(c) for c in result["clips_drawn"])
    return (f"{name:<28} {steps:>5} {result['worst_db']:>9.1f} {result['margin_db']:>10.1f} {counts:>11} "
            f"{'pass' if passes(result) else 'FAIL':>5} {result['ms']:>9.1f} {_fresh(result)}")  # fmt: skip


def _fresh(result: dict) -> str:
    """The fresh-noise columns: the share failing the check, and the draws of 32 passing it."""
    return f"{result['fail_share']:>10.1%} {result['draws_passing']:>6}/64"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="keys of the distillation draws")
    parser.add_argument(
        "--steps", type=int, default=FOUR_STEP.steps, help="distillation steps (critic updates)"
    )
    parser.add_argument(
        "--probe-every", type=int, default=400, help="4-step check of the DMD2 student every N steps"
    )
    parser.add_argument("--probe-from", type=int, default=1200, help="first step of those checks")
    parser.add_argument(
        "--one-step", type=int, nargs="?", default=0, const=ONE_STEP.steps, metavar="N",
        help=f"also distil 1-step students for N steps (without N: {ONE_STEP.steps})",
    )  # fmt: skip
    parser.add_argument(
        "--one-step-probe-every", type=int, default=2000, help="their 1-step check every N steps"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    started = time.perf_counter()
    setting = fit_teacher()
    print(f"teacher fitted in {time.perf_counter() - started:.1f} s")
    print(
        f"{'model':<28} {'steps':>5} {'worst dB':>9} {'margin dB':>10} {'clips A/B':>11} {'check':>5} {'ms/16':>9} {'fresh fail':>10} {'draws':>9}"
    )
    container, dmd = distillation(setting)
    for steps in (50, 4, 1):
        print(row("teacher", steps, timed_quality(setting, container, dmd, "teacher", steps)))
    probes: dict[int, list[tuple[int, dict]]] = {seed: [] for seed in args.seeds}
    for loss, name in (("distribution_matching", "DMD2 student"), ("flow_matching", "no-DM student")):
        for seed in args.seeds:
            probe = None
            if loss == "distribution_matching":
                probe = _prober(setting, probes[seed], args.probe_from, args.probe_every)
            started = time.perf_counter()
            recipe = dataclasses.replace(FOUR_STEP, steps=args.steps)
            container, dmd = distil(setting, loss, recipe, seed=seed, after_step=probe)
            took = time.perf_counter() - started
            for steps in (4, 1):
                print(
                    row(
                        f"{name} (seed {seed})",
                        steps,
                        timed_quality(setting, container, dmd, "predictor", steps),
                    )
                )
            print(f"  ({took:.1f} s to distil, with the probes)")
    print(f"\nDMD2 student at 4 steps every {args.probe_every} distillation steps from {args.probe_from}")
    for seed, seen in probes.items():
        cells = " ".join(
            f"{done}:{r['worst_db']:.1f}{'+' if passes(r) else '-'}({r['fail_share']:.1%})"
            for done, r in seen
        )
        print(
            f"seed {seed}: {sum(passes(r) for _, r in seen)}/{len(seen)} pass  "
            f"(step:worst dB +pass -fail (share of fresh noises failing)) {cells}"
        )
    if args.one_step:
        one_step(setting, args.seeds, args.one_step, args.one_step_probe_every)


def one_step(setting: dict, seeds: list[int], steps: int, every: int) -> None:
    """Students distilled for the 1-step schedule (``ONE_STEP``): their 1-step check every ``every`` steps,
    and :func:`fresh_check`'s columns; first the teacher on that schedule."""
    recipe = dataclasses.replace(ONE_STEP, steps=steps)
    print(f"\nDMD2 students for 1 step ({recipe}): the 1-step check every {every} steps")
    print(
        f"{'seed':>7} {'step':>6} {'sharp':>6} {'worst dB':>9} {'margin dB':>10} {'clips A/B':>11} {'check':>5} {'fresh fail':>10} {'draws':>9}"
    )

    def line(name: str, done: int, container, dmd) -> None:
        role = "teacher" if name == "teacher" else "predictor"
        r = checked(setting, container, dmd, role, 1)
        counts = "/".join(str(c) for c in r["clips_drawn"])
        print(f"{name:>7} {done:>6} {r['sharp']:>3}/32 {r['worst_db']:>9.1f} {r['margin_db']:>10.1f} {counts:>11} "
              f"{'pass' if passes(r) else 'FAIL':>5} {_fresh(r)}", flush=True)  # fmt: skip

    line("teacher", 0, *distillation(setting, recipe=recipe))
    for seed in seeds:

        def probe(done: int, averaged, dmd, seed=seed) -> None:
            if done % every == 0:
                line(str(seed), done, averaged(), dmd)

        distil(setting, recipe=recipe, seed=seed, after_step=probe)


def _prober(setting: dict, seen: list, start: int, every: int):
    """An ``after_step`` that records :func:`checked` at 4 steps every ``every`` steps from ``start``."""

    def probe(done: int, averaged, dmd) -> None:
        if done >= start and (done - start) % every == 0:
            seen.append((done, checked(setting, averaged(), dmd, "predictor", 4)))

    return probe


if __name__ == "__main__":
    main()
