"""Does reward fine-tuning (Flow-GRPO; DiffusionNFT where built) raise a colour reward of held-out prompts on a
tiny Wan2.2 model whose colourless captions have several colours, without hacking named colours or collapsing
the clips, and does a control with shuffled rewards not? (Not a test.)

Issue 47's learning acceptance, one CPU process, everything through the trainer at 1 rank:

1. **The toy** (``make-tiny``, cached in ``<out>/tiny``): 48 clips of 16x16 px x 5 frames, every (colour,
   shape, direction) of :data:`TOY_COLOURS` x 3 shapes x 4 directions; each clip has two captions, one naming
   its colour ("a red circle moving up") and one that does not ("a circle moving up"), the dataset drawing
   one of them per sample. A colourless caption therefore comes with clips of four colours. VAE fitted (600
   steps), the demo's one-token predictor (``wan22_train.demo.DEMO_TRANSFORMER``).
2. **The base** (cached in ``<out>/base``): the trainer's ordinary t2v run (``tiny_t2v.yaml``, full fine-tune,
   ``--base-steps``) on that set, exported to a diffusers folder: a model that draws each named colour for a
   named caption and a colour that varies with the noise for a colourless one.
3. **Reward fine-tuning** (``--method``; ``grpo``: ``tiny_grpo.yaml``, LoRA rank 4 on the base) on the
   ``colour_target`` reward (the distance of a clip's mean RGB to ``--target``, default the toy's green),
   with the colourless captions of the 4 (shape, direction) pairs of :data:`RL_PAIRS` as the training
   prompts. ``--shuffle``: the control, each rollout's rewards permuted across the step's clips. ``--seed S``:
   the run's own randomness (``training.seed``: the rollouts' noise, the trained sigmas and their noise, the
   adapters' initialisation, the data order, the control's permutations), not the toy's, the base's or the
   held-out evaluation's, so that runs at several seeds are independent repeats of one setting.
4. **Held-out evaluation** (the trainer's validation, 4-step ODE samples, every ``--every`` steps; step 0:
   the policy as built, one step at learning rate 0): the 8 other (shape, direction) pairs' colourless
   captions x seeds 0-3 (unseen by the reward fine-tuning, seen colourless by the base) and 4 captions naming
   a colour (:data:`NAMED`) x seeds 0-3. From the written clips: the colourless prompts' mean reward and
   spread, their colour (the shape's pixels' nearest toy colour) histogram, the share of named-colour samples
   drawn in the named colour, and the share of colourless samples whose shape moves as captioned
   (``mm_data.moves_as_captioned``). Distinctness: ``within``, the mean RMS distance (pixels in [0, 1])
   between the 4 seeds' clips of a prompt (in the base mostly their colours), and ``across``, between the
   clips of different prompts at one seed (shape and motion: a collapse to one clip would take it to 0).

Usage: python benchmarks/wan_rl_learning.py --out /tmp/rl [--method grpo] [--steps 60] [--every 20]
       [--base-steps 600] [--lr 1e-2] [--seed S] [--shuffle] [--anchor kl|colour|kept] [--anchor-unseen] [--ema D]
       [--option KEY=VALUE ...] [--override K=V ...]
       python benchmarks/wan_rl_learning.py --out /tmp/rl --report RUN [RUN ...] [--plot curves.png] [--summary]
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import socket
import time
from pathlib import Path

import numpy as np
import torch

TOY_COLOURS = ("red", "green", "blue", "yellow")
SHAPES = ("circle", "square", "triangle")
DIRECTIONS = ("up", "down", "left", "right")
#: The (shape, direction) pairs whose colourless captions the reward fine-tuning trains on.
RL_PAIRS = (("circle", "up"), ("square", "left"), ("triangle", "down"), ("circle", "right"))
HELD_OUT = [f"a {s} moving {d}" for s, d in itertools.product(SHAPES, DIRECTIONS) if (s, d) not in RL_PAIRS]
#: Held-out captions naming a colour: the reward must not pull them to the target colour.
NAMED = ["a red square moving up", "a blue triangle moving right", "a yellow circle moving down",
         "a green square moving right"]  # fmt: skip
SEEDS = (0, 1, 2, 3)
#: The method's shipped config and its options section (``model.pipeline.<key>``).
METHODS = {"grpo": ("tiny_grpo.yaml", "grpo"), "nft": ("tiny_nft.yaml", "nft")}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="a folder for the toy, the base and the runs")
    parser.add_argument("--method", choices=sorted(METHODS), default="grpo")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=20, help="validate every this many steps")
    parser.add_argument("--base-steps", type=int, default=600, help="supervised steps of the base")
    parser.add_argument("--target", default="green", choices=TOY_COLOURS, help="the reward's target colour")
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--seed", type=int, help="the run's training.seed (rollout noise, trained sigmas, adapter "
                        "init, data order, the control's permutations); default: the config's")  # fmt: skip
    parser.add_argument("--shuffle", action="store_true", help="the control: rewards permuted across clips")
    parser.add_argument("--anchor", choices=("kl", "colour", "kept"),
                        help="also train on captions naming a colour: rewarded 0 (kl: only the KL term trains them), "
                        "by closeness to their own colour (colour), or 0 when drawn in their colour and -1 when not "
                        "(kept)")  # fmt: skip
    parser.add_argument("--anchor-colours", type=int, default=1, choices=range(1, len(TOY_COLOURS) + 1),
                        help="with --anchor: captions naming a colour per trained (shape, direction) pair")  # fmt: skip
    parser.add_argument("--anchor-unseen", action="store_true",
                        help="with --anchor: no anchor caption has the (colour, shape) of a held-out named caption")  # fmt: skip
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="model.pipeline.<method>.KEY=VALUE (repeatable)")  # fmt: skip
    parser.add_argument("--ema", type=float, metavar="DECAY",
                        help="keep an EMA of the adapters (training.ema.decay) and validate with it "
                        "(training.validation.ema), as Flow-GRPO's public trainer evaluates")  # fmt: skip
    parser.add_argument("--override", action="append", default=[], help="a further trainer override")
    parser.add_argument("--plot", type=Path, help="write the curves of the --report runs here (PNG)")
    parser.add_argument("--report", nargs="+", metavar="RUN",
                        help="train nothing: print the tables of these runs (folders in --out)")  # fmt: skip
    parser.add_argument("--summary", action="store_true",
                        help="with --report: one line per run against the acceptance, and their mean and min")  # fmt: skip
    return parser.parse_args()


# ---------------------------------------------------------------------------------------------- the toy
def make_toy(out: Path) -> Path:
    """The toy set (module docstring, 1.) in ``out``; its metadata with both captions per clip."""
    from mm_data.synthetic import COLOURS
    from wan22_train.demo import DEMO_CLIP, DEMO_TRANSFORMER
    from wan22_train.tiny import make_tiny

    shapes = list(itertools.product(TOY_COLOURS, SHAPES, DIRECTIONS))
    make_tiny(out, num_clips=len(shapes), vae_fit_steps=600, shapes=shapes, clip=DEMO_CLIP,
              transformer=DEMO_TRANSFORMER)  # fmt: skip
    rows = json.loads((out / "data" / "metadata.json").read_text())
    for row in rows:
        named = row["cap"][0]
        row["cap"] = [named, " ".join(w for w in named.split() if w not in COLOURS)]
    path = out / "data" / "metadata_both.json"
    path.write_text(json.dumps(rows, indent=1))
    return path


def rl_metadata(tiny: Path, anchors: int, *, unseen: bool = False) -> Path:
    """The reward fine-tuning's prompts: the colourless captions of :data:`RL_PAIRS` (one row each; the
    clip only fixes the rollouts' shape), each followed by ``anchors`` captions naming a colour on its pair
    (the ``k``-th pair's from the ``k``-th colour of :data:`TOY_COLOURS` on, in turn); ``unseen``: less those
    whose (colour, shape) is a held-out named caption's (:data:`NAMED`), so that those are never trained."""
    rows = json.loads((tiny / "data" / "metadata.json").read_text())
    held = {tuple(caption.split()[1:3]) for caption in NAMED}  # (colour, shape)
    keep = []
    for k, (shape, direction) in enumerate(RL_PAIRS):
        row = next(r for r in rows if r["cap"][0].endswith(f"{shape} moving {direction}"))
        keep.append({**row, "cap": [f"a {shape} moving {direction}"]})
        for j in range(anchors):
            colour = TOY_COLOURS[(k + j) % len(TOY_COLOURS)]
            if not (unseen and (colour, shape) in held):
                keep.append({**row, "cap": [f"a {colour} {shape} moving {direction}"]})
    name = f"metadata_rl{'_anchor' * (anchors > 0)}{anchors if anchors > 1 else ''}{'_unseen' * unseen}"
    path = tiny / "data" / f"{name}.json"
    path.write_text(json.dumps(keep, indent=1))
    return path


def train_base(tiny: Path, metadata: Path, out: Path, steps: int) -> Path:
    """The base (module docstring, 2.): ``tiny_t2v.yaml`` at 1 rank on both captions of every clip, exported
    to ``out/transformer``; reused when there."""
    from mm_trainer import load_run_config
    from wan22_train.cli import main as wan22_main
    from wan22_train.configs import config_path
    from wan22_train.demo import DEMO_CLIP, DEMO_TRAINING, demo_warmup
    from wan22_train.export import export_predictor
    from wan22_train.tiny import tiny_overrides

    exported = out / "transformer"
    if (exported / "config.json").is_file():
        return exported
    ckpt = out / "ckpt"
    overrides = [
        *tiny_overrides(tiny), f"data.data_path={metadata}", f"training.save={ckpt}",
        f"training.train_iters={steps}", f"training.save_interval={steps}",
        f"training.lr_warmup_iters={demo_warmup(steps)}", "parallel.ulysses_parallel_size=1",
        *(f"data.dataset.{k}={DEMO_CLIP[k]}" for k in ("num_frames", "height", "width")), *DEMO_TRAINING,
        "training.micro_batch_size=16", "training.tensorboard=false",
    ]  # fmt: skip
    started = time.time()
    assert wan22_main(["--config", str(config_path("tiny_t2v.yaml")), *overrides]) == 0
    print(f"base: {steps} steps in {time.time() - started:.0f} s")
    return export_predictor(load_run_config(ckpt), ckpt, exported)


# ---------------------------------------------------------------------------------- reward fine-tuning
def shuffle_rewards(seed: int | None) -> None:
    """The control: each rollout scorer call's rewards permuted across its clips (keyed by the call's count,
    and by ``seed`` when given, so the run is reproducible)."""
    from mm_pipelines import key_seed
    from mm_trainer.modes import rollout_scoring

    original = rollout_scoring.RolloutScorer.__call__
    calls = [0]

    def permuted(self, latents, prompts, *, groups, names):  # type: ignore[no-untyped-def]
        rewards, logged = original(self, latents, prompts, groups=groups, names=names)
        calls[0] += 1
        key = calls[0] if seed is None else key_seed(seed, "shuffle", calls[0])
        order = torch.randperm(len(rewards), generator=torch.Generator().manual_seed(key))
        return rewards[order], logged

    rollout_scoring.RolloutScorer.__call__ = permuted  # type: ignore[method-assign]


def register_anchor_reward(anchor: str) -> str:
    """The ``--anchor`` runs' reward, ``colour_target_anchor_<anchor>``: ``colour_target`` on captions that
    name no toy colour; on those that do, 0 (``kl``: a group of equal rewards has advantages 0, so only the
    KL term to the reference trains those prompts), ``colour_target`` toward the caption's own colour
    (``colour``; a group of clips all in that colour still differs by shade, and its normalised advantages are
    noise), or 0 when the clip's shape is drawn in the caption's colour (:func:`colour_of`) and -1 when not
    (``kept``: advantages 0 while a group keeps its colour, a push back toward it once a clip loses it)."""
    from mm_config import register_reward_schema
    from mm_config.rewards import ColourTargetOptions
    from mm_data.synthetic import COLOURS
    from mm_trainer.modes.rewards import ColourTarget, reward_register

    name = f"colour_target_anchor_{anchor}"

    @reward_register(name)
    class AnchoredColourTarget(ColourTarget):
        def __call__(self, samples: torch.Tensor, prompts: list[str]) -> torch.Tensor:
            scores = super().__call__(samples, prompts)
            for k, prompt in enumerate(prompts):
                named = [w for w in prompt.split() if w in COLOURS]
                if named and anchor == "kl":
                    scores[k] = 0.0
                elif named and anchor == "kept":
                    scores[k] = 0.0 if colour_of(as_frames(samples[k])) == named[0] else -1.0
                elif named:
                    own = ColourTarget([v / 255 for v in COLOURS[named[0]]])
                    scores[k] = own(samples[k : k + 1], [prompt])[0]
            return scores

    register_reward_schema(name, ColourTargetOptions)
    return name


def target_rgb(name: str) -> list[float]:
    from mm_data.synthetic import COLOURS

    return [round(v / 255, 4) for v in COLOURS[name]]


def fine_tune(
    tiny: Path, base: Path, run: Path, args: argparse.Namespace, *, steps: int, every: int, lr: float
) -> list[dict]:
    """One reward fine-tuning run of ``--method`` at 1 rank on the base; its metrics records."""
    from wan22_train.cli import main as wan22_main
    from wan22_train.configs import config_path
    from wan22_train.demo import DEMO_CLIP
    from wan22_train.tiny import tiny_overrides

    config, key = METHODS[args.method]
    if not config_path(config).is_file():
        raise SystemExit(f"--method {args.method}: {config} is not shipped on this branch")
    prompts = [p for p in [*HELD_OUT, *NAMED] for _ in SEEDS]
    seeds = [s for _ in [*HELD_OUT, *NAMED] for s in SEEDS]
    reward_id = register_anchor_reward(args.anchor) if args.anchor else "colour_target"
    reward = "[{id: " + reward_id + ", options: {target: " + json.dumps(target_rgb(args.target)) + "}}]"
    overrides = [
        *tiny_overrides(tiny), f"model.models.predictor.from_pretrained={base}",
        f"data.data_path={rl_metadata(tiny, args.anchor_colours if args.anchor else 0, unseen=args.anchor_unseen)}",
        f"training.save={run}", f"training.train_iters={steps}",
        *([f"training.seed={args.seed}"] if args.seed is not None else []),
        f"training.save_interval={steps}", f"training.lr={lr}", "training.tensorboard=false",
        "parallel.ulysses_parallel_size=1", f"training.rewards={reward}",
        "model.models.text_encoder.config.text_len=8",
        *(f"data.dataset.{k}={DEMO_CLIP[k]}" for k in ("num_frames", "height", "width")),
        *(f"model.pipeline.{key}.{option}" for option in args.option),
        f"training.validation={{interval: {every}, prompts: [{', '.join(prompts)}], seeds: {seeds}, "
        f"num_frames: {DEMO_CLIP['num_frames']}, height: {DEMO_CLIP['height']}, width: {DEMO_CLIP['width']}, "
        "fps: 8, sampling_steps: 4}",
        *([f"training.ema={{decay: {args.ema}}}", "training.validation.ema=true"] if args.ema else []),
        *args.override,
    ]  # fmt: skip
    assert wan22_main(["--config", str(config_path(config)), *overrides]) == 0
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


# -------------------------------------------------------------------------------------------- evaluation
def read_frames(mp4: Path) -> np.ndarray:
    """``uint8 [T, H, W, 3]`` frames of a written clip."""
    import av

    with av.open(str(mp4)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def as_frames(sample: torch.Tensor) -> np.ndarray:
    """A decoded clip ``[3, T, H, W]`` in [-1, 1] (what a reward on frames gets) as ``[T, H, W, 3]`` in 0-255."""
    return ((sample.float() + 1) * 127.5).clamp(0, 255).permute(1, 2, 3, 0).cpu().numpy()


def shape_mask(frames: np.ndarray) -> np.ndarray:
    """Which pixels of ``[T, H, W, 3]`` frames are the shape's (away from the background), flattened."""
    from mm_data.synthetic import BACKGROUND

    pixels = frames.reshape(-1, 3).astype(np.float64)
    return np.abs(pixels - np.array(BACKGROUND)).max(axis=1) > 40


def colour_of(frames: np.ndarray) -> str:
    """The toy colour nearest the mean of the shape's pixels (those away from the background); ``none`` when
    no pixel is."""
    from mm_data.synthetic import COLOURS

    pixels = frames.reshape(-1, 3).astype(np.float64)
    shape = shape_mask(frames)
    if shape.sum() < 4:
        return "none"
    mean = pixels[shape].mean(axis=0)
    return min(TOY_COLOURS, key=lambda c: float(np.linalg.norm(mean - np.array(COLOURS[c]))))


def evaluate(folder: Path) -> dict[str, float | str]:
    """The held-out measures of one validation (module docstring, 4.) from its clips and ``rewards.json``."""
    from mm_data import moves_as_captioned

    rows = json.loads((folder / "rewards.json").read_text())
    frames = [read_frames(folder / f"{i}.mp4") for i in range(len(rows))]
    prompts = [row["prompt"] for row in rows]
    colours = [colour_of(f) for f in frames]
    held = [i for i, p in enumerate(prompts) if p in HELD_OUT]
    rewards = np.array([rows[i]["reward"] for i in held])
    named = [i for i, p in enumerate(prompts) if p in NAMED]
    histogram = {c: sum(1 for i in held if colours[i] == c) for c in (*TOY_COLOURS, "none")}
    return {
        "reward": float(rewards.mean()), "spread": float(rewards.std()),
        "group_std": float(np.mean([np.std([rows[i]["reward"] for i in held if prompts[i] == p]) for p in HELD_OUT])),
        "within": _mean_distance(frames, [(i, j) for i, j in itertools.combinations(held, 2) if prompts[i] == prompts[j]]),
        "across": _mean_distance(frames, [(i, j) for i, j in itertools.combinations(held, 2) if prompts[i] != prompts[j]
                                          and rows[i]["seed"] == rows[j]["seed"]]),
        "moves": sum(moves_as_captioned(frames[i], prompts[i]) for i in held) / len(held),
        "size": float(np.mean([shape_mask(frames[i]).mean() for i in held])),
        "named_kept": sum(1 for i in named if prompts[i].split()[1] == colours[i]) / len(named),
        "colours": " ".join(f"{c[0]}{n}" for c, n in histogram.items()),
    }  # fmt: skip


def _mean_distance(frames: list[np.ndarray], pairs: list[tuple[int, int]]) -> float:
    """The mean RMS distance (pixels in [0, 1]) between the clips of each pair."""
    clip = [f.astype(np.float64) / 255 for f in frames]
    return float(np.mean([np.sqrt(((clip[i] - clip[j]) ** 2).mean()) for i, j in pairs]))


@functools.cache  # --report reads each run once for its table, --summary and --plot
def table(start: Path, run: Path) -> list[tuple[int, dict]]:
    """Each validation's measures: step 0 from the lr-0 run, then the run's."""
    out = [(0, evaluate(start / "validation" / "iter_0000001"))]
    for folder in sorted((run / "validation").glob("iter_*")):
        out.append((int(folder.name.split("_")[1]), evaluate(folder)))
    return out


def print_table(rows: list[tuple[int, dict]], records: list[dict]) -> None:
    print(
        "step  held-out reward  spread  group std  within  across  moves  named kept  colours (r g b y none)  | train"
    )
    last = 0
    for step, m in rows:
        window = [x["reward"] for x in records if last < x["step"] <= step and "reward" in x]
        train = f"{np.mean(window):.4f}" if window else ""
        print(f"{step:4d}  {m['reward']:.4f}          {m['spread']:.4f}  {m['group_std']:.4f}     {m['within']:.4f}  "
              f"{m['across']:.4f}  {m['moves']:.2f}   {m['named_kept']:.2f}        {m['colours']:22s}  | {train}")  # fmt: skip
        last = step


def summary_line(rows: list[tuple[int, dict]]) -> dict[str, float]:
    """One run against issue 47's first acceptance point: the held-out reward's rise at the end in units of
    the start's spread, the named-colour clips kept (of 16) at the end and at the worst look, "moves" at the
    end and at the worst look, "across" at the end less the start's, and the colourless clips' mean share of
    shape pixels ("size") at the start and the end (the reward is the whole clip's mean colour: a larger green
    shape scores higher)."""
    (_, start), (_, end) = rows[0], rows[-1]
    named = len(NAMED) * len(SEEDS)
    return {
        "steps": rows[-1][0], "rise": (end["reward"] - start["reward"]) / start["spread"],
        "named_end": end["named_kept"] * named, "named_min": min(m["named_kept"] for _, m in rows) * named,
        "moves_end": end["moves"], "moves_min": min(m["moves"] for _, m in rows),
        "across_gain": end["across"] - start["across"], "size_start": start["size"], "size_end": end["size"],
    }  # fmt: skip


def print_summary(out: Path, runs: list[str]) -> None:
    """:func:`summary_line` of each run, then their mean and min."""
    lines = {run: summary_line(table(out / "start", out / run)) for run in runs}
    print(
        "steps  rise (x start spread)  named kept end  min  moves end  min   across - start's  size start  end    run"
    )
    for run, m in [*lines.items(), *_mean_and_min(list(lines.values()))]:
        print(f"{m['steps']:5.0f}  {m['rise']:+.2f}x                {m['named_end']:4.1f}      {m['named_min']:4.1f}  "
              f"{m['moves_end']:.2f}       {m['moves_min']:.2f}  {m['across_gain']:+.4f}           {m['size_start']:.3f}       "
              f"{m['size_end']:.3f}  {run}")  # fmt: skip


def _mean_and_min(lines: list[dict[str, float]]) -> list[tuple[str, dict[str, float]]]:
    keys = lines[0].keys()
    return [
        ("mean", {k: float(np.mean([m[k] for m in lines])) for k in keys}),
        ("min", {k: float(np.min([m[k] for m in lines])) for k in keys}),
    ]


def plot(path: Path, out: Path, runs: list[str]) -> None:
    """The held-out reward and the named colours kept of ``runs`` (folders in ``out``) against the step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 5.5))
    for run in runs:
        rows = table(out / "start", out / run)
        steps = [s for s, _ in rows]
        label = (
            run.removeprefix("run_")
            .replace("group_size8_", "")
            .replace("timestep_fraction1.0_noise_level1.0_", "")
        )
        left.plot(steps, [m["reward"] for _, m in rows], marker="o", label=label)
        right.plot(steps, [m["named_kept"] for _, m in rows], marker="o")
    start = rows[0][1]
    for times in (2, 3):
        left.axhline(start["reward"] + times * start["spread"], color="grey", linestyle=":", linewidth=1)
        left.annotate(f"start + {times}x spread", (0, start["reward"] + times * start["spread"]), fontsize=7)
    left.set(xlabel="step", ylabel="held-out colourless reward (mean of 32)")
    right.set(xlabel="step", ylabel="named-colour samples kept (share of 16)", ylim=(0, 1.05))
    fig.legend(loc="lower center", ncol=2, fontsize=7)
    fig.tight_layout(rect=(0, 0.18, 1, 1))
    fig.savefig(path, dpi=100)


def free_port() -> int:
    """A TCP port free now (runs of this script side by side each take their own)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(free_port()))  # fmt: skip
    if args.report:
        for run in args.report:
            print(run)
            records = [
                json.loads(line) for line in (args.out / run / "metrics.jsonl").read_text().splitlines()
            ]
            print_table(table(args.out / "start", args.out / run), records)
        if args.summary:
            print_summary(args.out, args.report)
        if args.plot:
            plot(args.plot, args.out, args.report)
        return
    tiny = args.out / "tiny"
    base = train_base(tiny, make_toy(tiny), args.out / "base", args.base_steps)
    start = args.out / "start"
    if not (start / "validation" / "iter_0000001" / "rewards.json").is_file():
        fine_tune(tiny, base, start, args, steps=1, every=1, lr=0.0)
    if args.anchor_unseen and not args.anchor:
        raise SystemExit("--anchor-unseen leaves anchor captions out: it needs --anchor")
    if args.shuffle:
        shuffle_rewards(args.seed)
    options = "_".join(o.replace("=", "") for o in args.option)
    flags = (
        ("_shuffled" if args.shuffle else "")
        + (f"_anchor{'' if args.anchor == 'kl' else '_' + args.anchor}" if args.anchor else "")
        + (f"{args.anchor_colours}" if args.anchor and args.anchor_colours > 1 else "")
        + ("_unseen" if args.anchor_unseen else "")
        + (f"_ema{args.ema:g}" if args.ema else "")
    )
    seed = f"_seed{args.seed}" if args.seed is not None else ""
    # Folders differ by every setting but the step count: a longer run of one setting resumes the shorter.
    name = f"run_{args.method}{flags}{'_' + options if options else ''}_lr{args.lr:g}{seed}"
    started = time.time()
    records = fine_tune(tiny, base, args.out / name, args, steps=args.steps, every=args.every, lr=args.lr)
    print(f"{name}: {time.time() - started:.0f} s for {args.steps} steps")
    print_table(table(start, args.out / name), records)


if __name__ == "__main__":
    main()
