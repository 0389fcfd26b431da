"""``wan22-train``: mm-train with the Wan2.2 plugin loaded, plus make-tiny, sample, export and demo.

wan22-train --config t2v_a14b_high.yaml                 # train (same as `mm-train`)
torchrun --nproc-per-node 8 -m wan22_train --config X.yaml
wan22-train --config X.yaml --dry-run --world-size 64   # FSDP plan, bytes per rank
wan22-train make-tiny runs/tiny                         # tiny model set + clips
wan22-train make-pairs runs/tiny --target 1 0 0         # Diffusion-DPO pairs of its clips, by colour
wan22-train preprocess --config t2v_a14b_high_cached.yaml   # clips -> VAE latents + UMT5 embeddings
wan22-train sample --checkpoint runs/tiny/ckpt --prompt "a red square moving left" --out clip.mp4
wan22-train export --checkpoint runs/tiny/ckpt --out runs/tiny/export/transformer
wan22-train export --checkpoint runs/lora/ckpt --lora peft --out runs/lora/export/peft   # LoRA run
wan22-train export --checkpoint runs/both_lora/ckpt --lora comfyui --out runs/both_lora/pair   # expert: both
wan22-train export --checkpoint runs/tiny/ckpt --layout native --out runs/tiny/export/high_noise_model
wan22-train export --checkpoint runs/tiny/ckpt --ema --out runs/tiny/export/ema   # a training.ema run's average
wan22-train demo                                        # make-tiny + train + export + sample
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from wan22_train import __version__

COMMANDS: dict[str, str] = {
    "make-tiny": "write a tiny Wan2.2 model set (diffusers layout) + mp4 clips",
    "make-pairs": "write Diffusion-DPO pairs of a tiny set's clips, preferred: the clip nearer a target colour",
    "preprocess": "encode clips into the sharded VAE/UMT5 cache data.data_path; reruns encode only what changed (torchrun: ranks split the clips)",
    "sample": "generate a clip with a trained predictor",
    "export": "export the trained predictor (diffusers or official layout) or its LoRA (a pair for two experts)",
    "demo": "make-tiny (if missing) + train on 2 CPU processes + export + sample",
}
"""The commands besides training (``wan22-train --config ...``), with the line ``--help`` shows."""


def _load(config: str | None, checkpoint: str):
    """The run's config (default: the one saved beside ``checkpoint``) at the run's world size."""
    from mm_checkpoint import checkpoint_info
    from mm_config import load_config
    from mm_trainer import load_run_config

    if config is None:
        return load_run_config(checkpoint)
    return load_config(config, world_size=int(checkpoint_info(checkpoint)["world_size"]))


def _parser() -> argparse.ArgumentParser:
    from mm_trainer.cli import EMA_HELP

    from wan22_train.export_options import EXPERT_CHOICES, LORA_FORMATS

    p = argparse.ArgumentParser(prog="wan22-train", description="Wan2.2 tools; see the module docstring.")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    tiny = sub.add_parser("make-tiny", help=COMMANDS["make-tiny"])
    tiny.add_argument("out")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument(
        "--vae-fit-steps",
        type=int,
        default=None,
        help="steps of the tiny VAE's fit to the clips (0: random VAE)",
    )
    pairs = sub.add_parser("make-pairs", help=COMMANDS["make-pairs"])
    pairs.add_argument("tiny", help="a make-tiny folder: its data/metadata.json clips")
    pairs.add_argument("--target", type=float, nargs=3, required=True, metavar=("R", "G", "B"),
                       help="the preferred colour, RGB each in [0, 1]")  # fmt: skip
    pre = sub.add_parser("preprocess", help=COMMANDS["preprocess"])
    pre.add_argument("--config", required=True)
    pre.add_argument("overrides", nargs="*", help="dotted overrides, e.g. data.data_path=/tmp/cache")
    sample = sub.add_parser("sample", help=COMMANDS["sample"])
    sample.add_argument("--checkpoint", required=True, help="training checkpoint root (iter_* + tracker)")
    sample.add_argument("--config", help="training config (default: <checkpoint>/config.yaml)")
    sample.add_argument("--prompt", required=True)
    sample.add_argument("--out", required=True, help="output .mp4")
    sample.add_argument("--frames", type=int, default=9)
    sample.add_argument("--height", type=int, default=32)
    sample.add_argument("--width", type=int, default=32)
    sample.add_argument(
        "--steps", type=int, default=20,
        help="Euler steps; a distilled run (model.pipeline.distill) samples its student on the sigmas it trained on",
    )  # fmt: skip
    sample.add_argument(
        "--shift", type=float, help="sampling time shift (default: the run's training shift, a distillation's student_shift)"
    )  # fmt: skip
    sample.add_argument("--guidance", type=float, default=1.0)
    sample.add_argument("--seed", type=int, default=0)
    sample.add_argument("--fps", type=int, default=8)
    export = sub.add_parser("export", help=COMMANDS["export"])
    export.add_argument("--checkpoint", required=True)
    export.add_argument("--config", help="training config (default: <checkpoint>/config.yaml)")
    export.add_argument("--out", required=True)
    export.add_argument(
        "--layout",
        choices=("diffusers", "native"),
        default=None,
        help="key layout of a full export (default diffusers; native: the official release's names and "
        "config.json, what the official code and ComfyUI load); not with --lora",
    )
    export.add_argument(
        "--max-shard-size",
        default="5GB",
        help="a full export above this size is written in shards + diffusion_pytorch_model.safetensors.index.json",
    )
    export.add_argument(
        "--lora",
        choices=LORA_FORMATS,
        help="a LoRA run's adapters: peft (folder for diffusers' load_lora_weights), comfyui (a .safetensors "
        "file, official Wan names), merged (a diffusers transformer folder with the adapters merged in)",
    )
    export.add_argument("--ema", action="store_true", help=EMA_HELP)
    export.add_argument(
        "--submodel",
        default=None,
        help="which trained sub-model: predictor (default), or predictor_low for the low-noise expert of an "
        "`expert: both` run (diffusers A14B layout: transformer/ and transformer_2/)",
    )
    export.add_argument(
        "--expert",
        choices=EXPERT_CHOICES,
        default=None,
        help="--lora of an `expert: both` run: which expert's adapters (default both): --out is a folder that "
        "receives high_noise_model.safetensors + low_noise_model.safetensors (comfyui) or the folders "
        "high_noise_model/ + low_noise_model/ (peft, merged)",
    )
    demo = sub.add_parser("demo", help=COMMANDS["demo"])
    demo.add_argument("--out", default="runs/demo")
    demo.add_argument("--nproc", type=int, default=2)
    demo.add_argument("--steps", type=int, help="training steps (default: wan22_train.demo.DEMO_STEPS)")
    demo.add_argument(
        "overrides", nargs="*", help="dotted overrides of the training run, e.g. training.save_interval=5"
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        from mm_trainer.cli import main as train_main

        # the plugin registers the Wan pieces; imported once the arguments parsed and the config
        # validated (its schema is the torch-free config_schema), so --help and a refused config are quick
        return train_main(
            argv, prog="wan22-train", version=__version__, commands=COMMANDS, plugin="wan22_train.plugin"
        )
    args = _parser().parse_args(argv)
    if args.command == "make-tiny":
        from mm_trainer import fit_summary

        from wan22_train.tiny import DEMO_SHAPES, VAE_FIT_STEPS, make_tiny

        steps = VAE_FIT_STEPS if args.vae_fit_steps is None else args.vae_fit_steps
        shapes = {"num_clips": len(DEMO_SHAPES), "shapes": DEMO_SHAPES}
        print(make_tiny(args.out, seed=args.seed, vae_fit_steps=steps, **shapes))
        print(fit_summary(Path(args.out) / "vae"))
    elif args.command == "make-pairs":
        from mm_trainer.run.user_errors import UsageError

        from wan22_train.pairs import make_colour_pairs

        if not all(0.0 <= v <= 1.0 for v in args.target):
            raise UsageError(f"make-pairs: --target {args.target}: each of R G B must lie in [0, 1]")
        for path in make_colour_pairs(args.tiny, args.target):
            print(path)
    elif args.command == "preprocess":
        from mm_trainer import load_offline_config

        from wan22_train.preprocess import run_preprocess

        report = run_preprocess(load_offline_config(args.config, args.overrides))
        if report.rank == 0:  # the same totals on every rank
            print(report)
    elif args.command == "sample":
        from wan22_train.demo import training_shift
        from wan22_train.sampling import load_for_sampling, sample_video, student_sigmas, write_video

        config = _load(args.config, args.checkpoint)
        modules = load_for_sampling(config, args.checkpoint)
        shift = training_shift(config) if args.shift is None else args.shift
        video = sample_video(
            modules, args.prompt, num_frames=args.frames, height=args.height, width=args.width,
            steps=args.steps, shift=shift, guidance=args.guidance, seed=args.seed,
            sigmas=student_sigmas(config, args.steps, args.shift),
        )  # fmt: skip
        print(write_video(video, args.out, fps=args.fps))
    elif args.command == "export":
        print(_export(args))
    else:
        from wan22_train.demo import DEMO_STEPS, run_demo

        steps = DEMO_STEPS if args.steps is None else args.steps
        return run_demo(Path(args.out), nproc=args.nproc, steps=steps, overrides=args.overrides)
    return 0


def _export(args: argparse.Namespace) -> Path | str:
    from mm_trainer.run.user_errors import UsageError

    from wan22_train.export import EXPERT_SUBMODELS, export_lora, export_lora_pair, export_predictor

    config = _load(args.config, args.checkpoint)
    if args.lora is None:
        if args.expert is not None:
            raise UsageError("export: --expert picks the adapters of a LoRA pair (with --lora)")
        layout = args.layout or "diffusers"
        return export_predictor(
            config, args.checkpoint, args.out, layout=layout, submodel=args.submodel or "predictor", ema=args.ema,
            max_shard_size=args.max_shard_size,
        )  # fmt: skip
    if args.layout is not None:
        raise UsageError("export: --layout applies to full exports; --lora fixes its own layout")
    two_experts = all(s in config.model.sub_models() for s in EXPERT_SUBMODELS.values())
    if two_experts and args.submodel is None:
        paths = export_lora_pair(
            config, args.checkpoint, args.out, fmt=args.lora, expert=args.expert or "both", ema=args.ema
        )
        return "\n".join(str(p) for p in paths)
    if args.expert is not None:
        raise UsageError("export: --expert needs a run with both A14B experts (expert: both)")
    submodel = args.submodel or "predictor"
    return export_lora(config, args.checkpoint, args.out, fmt=args.lora, submodel=submodel, ema=args.ema)


def run() -> NoReturn:
    """Console-script and ``python -m`` entry: :func:`main`, leaving through ``mm_trainer.cli.run``."""
    from mm_trainer.cli import run as run_process

    run_process(main, prog="wan22-train")


if __name__ == "__main__":
    run()
