"""How close ``mm-train plan`` comes to the memory a real run allocates: predicted vs measured peak per rank.

Eight runs of 2 gloo ranks on CPU, each planned (``mm_trainer.planner.trace_run`` with ``--device cpu``:
CPU kernels' memory models, the optimizer as on CPU) and then trained for 2 steps by the real
``Trainer`` (real tensors, random-initialized scaled models, real clips / latents):

- seven scaled Wan2.2 runs (online: the tiny VAE and UMT5 of ``wan22-train make-tiny``, a 117 M-parameter
  predictor: 12 blocks of 768, 12 heads, ffn 3072): ``fsdp`` (FSDP only), ``ulysses2``, ``lora``
  (rank-32 adapters on every projection of a frozen predictor), ``selective`` (selective recompute of
  the blocks), ``ema`` (``training.ema``), ``packed`` (``data.packing``: 8 clips of four shapes, one
  of them trained as one-frame images, 80 / 384 / 640 / 720 tokens, in packed micro-batches of up to
  1824 tokens, one per rank and step; the plan traces the worst cases of that budget,
  ``mm_trainer.planner.packing``), ``grpo`` (Flow-GRPO of the ``lora`` run's policy: 4 clips per prompt
  sampled on 2 SDE steps, decoded by the VAE and scored by ``colour_target``, the update on 1 of the
  steps with the KL to the base with the adapters off; ``mm_trainer.planner.rollouts``. 2 steps, not
  more: the profiler's records of a rank measuring 4 steps grew past 9 GiB and were killed here);
- one LTX-2 run (``ltx2``): a 10-block, 640-wide ``LTX2VideoTransformer3DModel`` on latents written
  by ``ltx2-train preprocess`` from the tiny LTX-2 set.

Measured independently of the planner: every CPU allocation goes through c10's allocator, which
reports each one with the running total to torch's profiler (``profile_memory=True``, started before
the ``Trainer`` is built); the measured peak is the largest total during ``Trainer.train`` (both
steps). Each rank's process RSS (``ru_maxrss``: Python, libraries, everything) is printed beside it
as an upper bound. Exit 1 when a prediction is off by more than 10%.

    hatch run python benchmarks/plan_accuracy.py                  # all eight (~11 min on 2 free cores)
    hatch run python benchmarks/plan_accuracy.py --runs fsdp ltx2  # some
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

TOLERANCE = 0.10
WORLD = 2
WAN_CLIP = {"num_frames": 9, "height": 32, "width": 64, "fps": 8}
WAN_PREDICTOR = {
    "model_type": "t2v", "num_layers": 12, "dim": 768, "num_heads": 12, "ffn_dim": 3072, "in_dim": 4, "out_dim": 4,
    "text_dim": 32, "freq_dim": 256, "patch_size": [1, 2, 2], "eps": 1.0e-6, "text_len": 16, "qk_norm": True,
    "cross_attn_norm": True,
}  # fmt: skip
LTX2_CLIP = {"num_frames": 17, "height": 64, "width": 64}
LTX2_TRANSFORMER = {
    "num_layers": 10, "num_attention_heads": 10, "attention_head_dim": 64, "in_channels": 8, "out_channels": 8,
    "cross_attention_dim": 640, "caption_channels": 32, "audio_in_channels": 16, "audio_out_channels": 16,
    "audio_num_attention_heads": 4, "audio_attention_head_dim": 16, "audio_cross_attention_dim": 64,
    "vae_scale_factors": [2, 4, 4], "base_height": 64, "base_width": 64,
}  # fmt: skip
PACKED_CLIPS = [(40, 32), (32, 64), (64, 32), (48, 48)]  # source clip sizes, cycled; 9 frames each
PACKED_BUCKETS = [[40, 32, 1], [32, 64, 9], [64, 32, 5], [48, 48, 9]]  # the 40x32 clips train as images
PACKED_BUDGET = 1824  # tokens 80 + 640 + 384 + 720: each rank's half of the 8 samples, balanced
GRPO = {"group_size": 4, "sampling_steps": 2, "timestep_fraction": 0.5, "kl_weight": 0.04}
RUNS = ("fsdp", "ulysses2", "lora", "selective", "ema", "packed", "grpo", "ltx2")


# ------------------------------------------------------------------------------------------ configs


def wan_config(name: str, tiny: Path) -> dict[str, Any]:
    predictor: dict[str, Any] = {"model_id": "wan2_2_predictor", "meta_init": True, "config": WAN_PREDICTOR}
    cfg: dict[str, Any] = {
        "parallel": {"fsdp_plan": {"apply_modules": ["predictor.blocks.{*}", "text_encoder.encoder.block.{*}"],
                                   "ignored_modules": ["ae"], "num_to_forward_prefetch": 1,
                                   "num_to_backward_prefetch": 1}},
        "model": {"container_id": "wan2_2_container", "pipeline": {"task": "t2v", "expert": "all"}, "models": {
            "ae": {"model_id": "wan_video_vae", "from_pretrained": str(tiny / "vae"), "freeze": True},
            "text_encoder": {"model_id": "umt5", "from_pretrained": str(tiny / "text_encoder"), "freeze": True,
                             "meta_init": True, "config": {"tokenizer": str(tiny / "tokenizer"), "text_len": 16}},
            "predictor": predictor,
        }},
        "data": {"dataset_id": "video_text", "data_path": str(tiny / "data" / "metadata.json"),
                 "dataset": {k: v for k, v in WAN_CLIP.items() if k != "fps"}},
        "training": {"plugin": ["wan22_train.plugin"], "seed": 1234, "micro_batch_size": 1, "train_iters": 2,
                     "lr": 1.0e-4, "lr_scheduler": "constant", "clip_grad": 1.0, "log_interval": 1,
                     "tensorboard": False},
    }  # fmt: skip
    if name == "ulysses2":
        cfg["parallel"]["ulysses_parallel_size"] = 2
    elif name == "lora":
        targets = [
            "blocks.{*}.self_attn.?",
            "blocks.{*}.cross_attn.?",
            "blocks.{*}.ffn.0",
            "blocks.{*}.ffn.2",
        ]
        predictor["lora"] = {"target_modules": targets, "rank": 32, "alpha": 32}
        # LoRA adapts pretrained weights: the scaled predictor, saved once with random values
        predictor["from_pretrained"] = str(_scaled_predictor(tiny.parent / "wan_predictor"))
    elif name == "selective":
        cfg["features"] = {
            "recompute_plan": {"apply_modules": ["predictor.blocks.{*}"], "policy": "selective"}
        }
    elif name == "ema":
        cfg["training"]["ema"] = {"decay": 0.99}
    elif (
        name == "grpo"
    ):  # Flow-GRPO of the LoRA run's policy: 4 clips per prompt, 4 SDE steps, a reward on frames
        cfg = wan_config("lora", tiny)
        cfg["model"]["pipeline"]["grpo"] = GRPO
        cfg["training"] |= {"phases": {"grpo": {"submodels": ["predictor"]}},
                            "rewards": [{"id": "colour_target", "options": {"target": [1.0, 0.0, 0.0]}}]}  # fmt: skip
    elif name == "packed":
        cfg["data"]["data_path"] = str(_mixed_clips(tiny.parent / "mixed_clips") / "metadata.json")
        cfg["data"]["dataset"]["buckets"] = PACKED_BUCKETS
        cfg["data"]["packing"] = {"token_budget": PACKED_BUDGET}
        cfg["training"] |= {"global_batch_size": 8, "micro_batch_size": 4}
    return cfg


def _mixed_clips(out: Path) -> Path:
    """8 clips of 9 frames cycling :data:`PACKED_CLIPS` (the packed run's mixed set)."""
    if not (out / "metadata.json").is_file():
        from mm_data import make_synthetic_dataset

        make_synthetic_dataset(out, num_clips=8, sizes=PACKED_CLIPS, num_frames=(9,), fps=(8,), seed=0)
    return out


def _scaled_predictor(out: Path) -> Path:
    """The scaled predictor with random weights as a native Wan folder (the LoRA run's base)."""
    if not (out / "config.json").is_file():
        from wan22_train.model import WanDiT, WanDiTConfig, save_wan_dit

        config = {k: tuple(v) if isinstance(v, list) else v for k, v in WAN_PREDICTOR.items()}
        save_wan_dit(WanDiT(WanDiTConfig(**config)), out)
    return out


def ltx2_config(tiny: Path, cache: Path) -> dict[str, Any]:
    preprocess = {"source": str(tiny / "clips" / "metadata.json"), "model_root": str(tiny), **LTX2_CLIP,
                  "max_sequence_length": 16, "audio": False}  # fmt: skip
    return {
        "parallel": {"fsdp_plan": {"apply_modules": ["model.transformer_blocks.{*}"], "num_to_forward_prefetch": 1,
                                   "num_to_backward_prefetch": 1}},
        "model": {"model_id": "ltx2_predictor", "meta_init": True, "config": LTX2_TRANSFORMER,
                  "pipeline": {"audio": False, "first_frame_conditioning_p": 0.0}},
        "data": {"dataset_id": "ltx2_precomputed", "data_path": str(cache), "dataset": {"preprocess": preprocess}},
        "training": {"plugin": ["ltx2_train.plugin"], "seed": 1234, "micro_batch_size": 1, "train_iters": 2,
                     "lr": 1.0e-4, "lr_scheduler": "constant", "clip_grad": 1.0, "log_interval": 1,
                     "tensorboard": False},
    }  # fmt: skip


def prepare(work: Path, runs: list[str]) -> dict[str, Path]:
    """The model sets, the LTX-2 latents and one config file per run."""
    out = {}
    if any(r != "ltx2" for r in runs):
        from wan22_train.tiny import make_tiny

        tiny = make_tiny(work / "wan_tiny", clip=WAN_CLIP, num_clips=4, vae_fit_steps=0)
        for name in (r for r in runs if r != "ltx2"):
            out[name] = _write(work / f"{name}.yaml", wan_config(name, tiny))
    if "ltx2" in runs:
        out["ltx2"] = _write(work / "ltx2.yaml", ltx2_config(*_ltx2_data(work)))
    return out


def _ltx2_data(work: Path) -> tuple[Path, Path]:
    from ltx2_train.tiny import make_tiny
    from mm_data import make_synthetic_dataset

    tiny = make_tiny(work / "ltx2_tiny", vae_fit_steps=0)
    clips = tiny / "clips"
    if not (clips / "metadata.json").is_file():
        size = ((LTX2_CLIP["height"], LTX2_CLIP["width"]),)
        make_synthetic_dataset(
            clips, num_clips=4, sizes=size, fps=(8,), num_frames=(LTX2_CLIP["num_frames"],), seed=0
        )
    cache = work / "ltx2_latents"
    config = _write(work / "ltx2.yaml", ltx2_config(tiny, cache))
    if not any(cache.glob("*.safetensors")):
        subprocess.run(
            [sys.executable, "-m", "ltx2_train", "preprocess", "--config", str(config)], check=True
        )
    return tiny, cache


def _write(path: Path, cfg: dict) -> Path:
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


# ---------------------------------------------------------------------------------- the two sides


def predict(config_path: Path) -> dict[str, Any]:
    """The planner's peak for rank 0 (a process of its own: the fake process group)."""
    import torch
    from mm_config import load_config
    from mm_trainer.planner import summarize, trace_run
    from mm_trainer.planner.device_specs import device_spec

    torch.set_num_threads(1)  # as the measured ranks run (torchrun: OMP_NUM_THREADS=1)
    config = load_config(str(config_path), world_size=WORLD)
    run = trace_run(config, world_size=WORLD, device=device_spec("cpu"))
    summary = summarize(run)
    return {"peak": summary.peak_bytes, "part": summary.peak_part, "categories": summary.categories,
            "seconds": run.seconds}  # fmt: skip


def measure(config_path: Path, out: Path) -> None:
    """One rank (under torchrun): build the real Trainer and train 2 steps under the profiler's
    allocation reports; write the peak allocated during ``train`` and the process's peak RSS."""
    from mm_config import load_config
    from mm_trainer import Trainer
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile, record_function

    config = load_config(str(config_path), world_size=int(os.environ["WORLD_SIZE"]))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        trainer = Trainer(config)
        with record_function("plan_accuracy.train"):
            trainer.train()
    allocations, window = [], None
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        stack.extend(event.children)
        if event.typed[0] == _EventType.Allocation:
            allocations.append((event.start_time_ns, event.typed[1].total_allocated))
        elif event.name == "plan_accuracy.train":
            window = (event.start_time_ns, event.end_time_ns)
    assert window is not None
    peak = max(total for t, total in allocations if window[0] <= t <= window[1])
    rank = trainer.rank
    trainer.close()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    (out / f"rank{rank}.json").write_text(json.dumps({"peak": peak, "rss": rss}))


def _predict_in_subprocess(config: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "--predict", str(config)], check=True, capture_output=True, text=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _measure_in_torchrun(config: Path, out: Path) -> list[dict[str, Any]]:
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={WORLD}", __file__,
           "--measure", str(config), "--out", str(out)]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", nargs="+", choices=RUNS, default=list(RUNS))
    parser.add_argument("--work", help="working folder (default: a temporary one)")
    parser.add_argument("--predict", help=argparse.SUPPRESS)
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.predict:
        print(json.dumps(predict(Path(args.predict))))
        return 0
    if args.measure:
        measure(Path(args.measure), Path(args.out))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        return _compare(prepare(work, args.runs), work)


def _compare(configs: dict[str, Path], work: Path) -> int:
    mib = 2**20
    print(f"{'run':<10} {'predicted':>10} {'measured r0':>12} {'measured r1':>12} {'error r0':>9} {'error r1':>9} "
          f"{'RSS r0':>9} {'RSS r1':>9}  peak during")  # fmt: skip
    worst = 0.0
    for name, config in configs.items():
        plan = _predict_in_subprocess(config)
        ranks = _measure_in_torchrun(config, work / f"measured_{name}")
        errors = [plan["peak"] / rank["peak"] - 1 for rank in ranks]
        worst = max(worst, *(abs(e) for e in errors))
        measured = " ".join(f"{rank['peak'] / mib:>8.0f} MiB" for rank in ranks)
        rss = " ".join(f"{rank['rss'] / mib:>5.0f} MiB" for rank in ranks)
        print(f"{name:<10} {plan['peak'] / mib:>6.0f} MiB {measured} {errors[0]:>+9.1%} {errors[1]:>+9.1%} {rss}  "
              f"{plan['part']}", flush=True)  # fmt: skip
    print(f"worst error {worst:.1%} over both ranks (tolerance {TOLERANCE:.0%})")
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
