"""``ltx2-train``: mm-train with the LTX-2 plugin loaded, plus make-tiny, preprocess, export and sample.

ltx2-train make-tiny runs/ltx2_tiny                                  # tiny model set + clips (VAE fitted)
ltx2-train make-tiny runs/ltx2_tiny_23 --release 2.3                 # the same with an LTX-2.3 transformer
ltx2-train make-tiny runs/ltx2_tiny --single-file                    # + runs/ltx2_tiny/ltx-2-tiny.safetensors
ltx2-train make-tiny runs/ltx2_tiny_25 --release 2.5                 # LTX-2.5: its transformer, Gemma-4 text side
ltx2-train preprocess --config configs/tiny_t2av.yaml                # clips -> cached latents
torchrun --nproc-per-node 2 -m ltx2_train --config configs/tiny_t2av.yaml   # train
ltx2-train --config configs/t2av.yaml --dry-run --world-size 8       # FSDP plan on meta
ltx2-train export --checkpoint runs/ltx2_tiny/ckpt --out runs/ltx2_tiny/export/transformer
ltx2-train export --checkpoint runs/ltx2_lora/ckpt --lora peft --out runs/ltx2_lora/export/peft   # LoRA run
ltx2-train export --checkpoint runs/ltx2_lora/ckpt --lora comfyui --out runs/ltx2_lora/export/lora.safetensors
ltx2-train export --checkpoint runs/ltx2_tiny/ckpt --ema --out runs/ltx2_tiny/export/ema   # training.ema's average
ltx2-train export --checkpoint runs/ltx2_tiny/ckpt --layout native --out runs/ltx2_tiny/export/ltx2.safetensors
ltx2-train sample --checkpoint runs/ltx2_tiny/ckpt --prompt "a red square moving left" --out clip.mp4  # + clip.wav
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from ltx2_train import __version__

COMMANDS: dict[str, str] = {
    "make-tiny": "write a tiny LTX-2 model set (diffusers layout) + clips",
    "preprocess": "encode clips into the sharded latent cache data.data_path; reruns encode only what changed (torchrun: ranks split the clips)",
    "export": "export the trained transformer as a diffusers folder",
    "sample": "generate a clip (and its audio, as a .wav beside it) with a trained run",
}
"""The commands besides training (``ltx2-train --config ...``), with the line ``--help`` shows."""


def _load(config: str, overrides: Sequence[str]):
    """A user's config, validated as one process (preprocessing ignores the parallel layout)."""
    from mm_trainer import load_offline_config

    return load_offline_config(config, overrides)


def _run_config(config: str | None, checkpoint: str):
    """The run's config (default: the one saved beside ``checkpoint``) at the run's world size."""
    from mm_trainer import load_run_config

    return load_run_config(checkpoint) if config is None else _load(config, [])


def _parser() -> argparse.ArgumentParser:
    from mm_trainer.cli import EMA_HELP

    p = argparse.ArgumentParser(prog="ltx2-train", description="LTX-2 tools; see the module docstring.")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    tiny = sub.add_parser("make-tiny", help=COMMANDS["make-tiny"])
    tiny.add_argument("out")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument(
        "--vae-fit-steps",
        type=int,
        default=None,
        help="steps of the tiny video VAE's fit to the clips (0: random VAE)",
    )
    tiny.add_argument(
        "--release",
        default="2.0",
        help="the transformer's LTX-2 release: 2.0 (default), 2.3 or 2.5, with that release's text side "
        "(2.0 and 2.3: Gemma-3; 2.5: Gemma-4; 2.3 and 2.5: per-modality connectors)",
    )
    tiny.add_argument(
        "--single-file",
        action="store_true",
        help="also write the set as one official release file, OUT/ltx-2-tiny.safetensors (transformer, VAEs, a "
        "tiny vocoder and connectors; LTX-2.0 only)",
    )
    pre = sub.add_parser("preprocess", help=COMMANDS["preprocess"])
    pre.add_argument("--config", required=True)
    pre.add_argument("overrides", nargs="*", help="dotted overrides, e.g. data.data_path=/tmp/cache")
    export = sub.add_parser("export", help=COMMANDS["export"])
    export.add_argument("--checkpoint", required=True, help="training checkpoint root (iter_* + tracker)")
    export.add_argument("--config", help="training config (default: <checkpoint>/config.yaml)")
    export.add_argument("--out", required=True)
    export.add_argument(
        "--lora",
        choices=("peft", "comfyui", "merged"),
        help="a LoRA run's adapters: peft (folder for LTX2Pipeline.load_lora_weights), comfyui (a .safetensors "
        "file in the official LTX-2 trainer's layout, for ComfyUI) or merged (a diffusers transformer folder "
        "with the adapters merged in)",
    )
    export.add_argument("--ema", action="store_true", help=EMA_HELP)
    export.add_argument(
        "--layout",
        choices=("diffusers", "native"),
        default="diffusers",
        help="diffusers: a transformer/ folder; native: the official LTX-2 single file (--out X.safetensors: "
        "model.diffusion_model.<official names> + the official config metadata, for ComfyUI / from_single_file)",
    )
    sample = sub.add_parser("sample", help=COMMANDS["sample"])
    sample.add_argument("--checkpoint", required=True, help="training checkpoint root (iter_* + tracker)")
    sample.add_argument("--config", help="training config (default: <checkpoint>/config.yaml)")
    sample.add_argument("--prompt", required=True)
    sample.add_argument("--out", required=True, help="output .mp4 (audio: the same name with .wav)")
    sample.add_argument("--frames", type=int, default=5)
    sample.add_argument("--height", type=int, default=16)
    sample.add_argument("--width", type=int, default=16)
    sample.add_argument("--fps", type=int, default=8)
    sample.add_argument("--steps", type=int, default=20)
    sample.add_argument("--seed", type=int, default=0)
    sample.add_argument(
        "--guidance-scale", type=float, default=1.0,
        help="classifier-free guidance against --negative-prompt: the video's, and the audio's unless "
        "--audio-guidance-scale is given (1: none, one forward per step)",
    )  # fmt: skip
    sample.add_argument(
        "--audio-guidance-scale", type=float, default=None,
        help="the audio stream's guidance scale (diffusers' LTX2Pipeline audio_guidance_scale); default: --guidance-scale",
    )  # fmt: skip
    sample.add_argument("--negative-prompt", default="", help="the unconditional prompt of guidance")
    sample.add_argument(
        "--reference",
        help="IC-LoRA reference clip (--frames frames at --fps) for a run trained "
        "with model.pipeline.reference; left out, such a run samples without one",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        from mm_trainer.cli import main as train_main

        # the plugin registers the LTX-2 pieces; imported once the arguments parsed and the config
        # validated (its schema is the torch-free config_schema), so --help and a refused config are quick
        return train_main(
            argv, prog="ltx2-train", version=__version__, commands=COMMANDS, plugin="ltx2_train.plugin"
        )
    args = _parser().parse_args(argv)
    if args.command == "make-tiny":
        from mm_trainer import fit_summary

        from ltx2_train.tiny import VAE_FIT_STEPS, make_tiny, write_tiny_release_file

        steps = VAE_FIT_STEPS if args.vae_fit_steps is None else args.vae_fit_steps
        if args.single_file and args.release != "2.0":
            raise ValueError(f"make-tiny --single-file: LTX-2.0 only (got --release {args.release})")
        print(make_tiny(args.out, seed=args.seed, vae_fit_steps=steps, release=args.release))
        print(fit_summary(Path(args.out) / "vae"))
        if args.single_file:
            print(write_tiny_release_file(args.out, seed=args.seed))
    elif args.command == "preprocess":
        from ltx2_train.preprocess import run_preprocess

        report = run_preprocess(_load(args.config, args.overrides))
        if report.rank == 0:  # the same totals on every rank
            print(report)
    elif args.command == "sample":
        from ltx2_train.sampling import load_for_sampling, sample_clip, write_sample

        modules = load_for_sampling(_run_config(args.config, args.checkpoint), args.checkpoint)
        video, mel = sample_clip(
            modules, args.prompt, num_frames=args.frames, height=args.height, width=args.width,
            frame_rate=args.fps, steps=args.steps, seed=args.seed, guidance_scale=args.guidance_scale,
            audio_guidance_scale=args.audio_guidance_scale, negative_prompt=args.negative_prompt,
            reference=args.reference,
        )  # fmt: skip
        for path in write_sample(modules, video, mel, args.out, fps=args.fps):
            print(path)
    else:
        from ltx2_train.export import export_transformer, export_transformer_lora

        config = _run_config(args.config, args.checkpoint)
        if args.lora is not None and args.layout != "diffusers":
            raise ValueError(
                f"--layout {args.layout} applies to a full transformer; a LoRA run's official-layout file is "
                "--lora comfyui"
            )
        if args.lora is None:
            print(export_transformer(config, args.checkpoint, args.out, ema=args.ema, layout=args.layout))
        else:
            print(export_transformer_lora(config, args.checkpoint, args.out, fmt=args.lora, ema=args.ema))
    return 0


def run() -> NoReturn:
    """Console-script and ``python -m`` entry: :func:`main`, leaving through ``mm_trainer.cli.run``."""
    from mm_trainer.cli import run as run_process

    run_process(main, prog="ltx2-train")


if __name__ == "__main__":
    run()
