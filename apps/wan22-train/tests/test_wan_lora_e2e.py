"""LoRA on tiny Wan2.2, 2 gloo ranks, FSDP2 + Ulysses 2: one run trains, saves, resumes and exports.

Checked: a fixed-draw loss decreases; the base weights stay bitwise the pretrained ones; a resume from
the step-4 checkpoint trains the uninterrupted run's losses; the PEFT file loaded into a diffusers
``WanPipeline`` with ``load_lora_weights``, the ComfyUI file (through the same loader's converter for
the official-Wan-names layout), the merged folder loaded in ``WanTransformer3DModel`` and the sampling
loader (base from its source, adapters from the checkpoint) compute the outputs of the trained (sharded,
context-parallel) model; the ComfyUI keys follow ComfyUI's layout.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from wan22_train.configs import config_path
from wan22_train.key_maps import diffusers_to_native
from wan22_train.tiny import make_tiny, tiny_overrides

pytestmark = pytest.mark.slow

STEPS, SAVE_AT = 8, 4
WAN_README = "apps/wan22-train/README.md"
TRAIN = "torchrun --nproc-per-node 2 -m wan22_train --config apps/wan22-train/configs/tiny_t2v_lora.yaml"
EXPORT = "wan22-train export --checkpoint runs/tiny_lora/ckpt --lora peft --out runs/tiny_lora/peft"
COMFY_KEY = re.compile(
    r"diffusion_model\.blocks\.\d+\.(self_attn\.[qkvo]|cross_attn\.[qkvo]|ffn\.[02])\.(lora_down\.weight|lora_up\.weight|alpha)"
)


def _inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return (
        torch.randn(2, 4, 3, 8, 8, generator=g),
        torch.tensor([900.0, 250.0]),
        torch.randn(2, 7, 32, generator=g),
    )


def _fixed_draw_loss(trainer, batch: dict) -> float:
    """The training loss of ``batch`` with the noise and timesteps of fixed keys."""
    from mm_pipelines import SampleRNG

    with torch.no_grad():
        return float(trainer.model(rng=SampleRNG.for_batch(2, seed=0), **batch).loss)


def _base_mismatches(trainer, pretrained: dict[str, torch.Tensor]) -> list[str]:
    predictor = trainer.model.predictor
    with trainer.lora.base_names("predictor", predictor):
        state = predictor.state_dict()
    return [k for k, v in state.items() if not torch.equal(v.full_tensor(), pretrained[k])]


def _train_and_probe(
    rank: int, world: int, overrides: list[str], resume_root: str, tiny: str, yaml: str
) -> dict:
    import torch.distributed as dist
    from mm_config import load_config
    from mm_trainer import Trainer, build_batch_stream

    config = load_config(yaml, overrides, world_size=world)
    trainer = Trainer(config)
    batch = build_batch_stream(
        config.data, global_batch_size=2, micro_batch_size=2, dp_rank=0, dp_size=1, seed=0
    ).next_batch()
    batch.pop("sample_ids")
    before = _fixed_draw_loss(trainer, batch)
    trainer.train()
    after = _fixed_draw_loss(trainer, batch)
    pretrained = diffusers_to_native(
        load_file(Path(tiny) / "transformer" / "diffusion_pytorch_model.safetensors")
    )
    mismatches = _base_mismatches(trainer, pretrained)
    with torch.no_grad():
        output = trainer.model.predictor(*_inputs())
    trainer.run_dir.release()

    # Resume: a new save dir holding only the step-4 checkpoint trains steps 5..8 again.
    save = Path(config.training.save)
    if rank == 0:
        shutil.copytree(save / f"iter_{SAVE_AT:07d}", Path(resume_root) / f"iter_{SAVE_AT:07d}")
        (Path(resume_root) / "latest_checkpointed_iteration.txt").write_text(f"{SAVE_AT}\n")
    dist.barrier()
    resumed_config = [*overrides, f"training.save={resume_root}"]
    resumed = Trainer(load_config(yaml, resumed_config, world_size=world))
    start = resumed.start_iteration
    resumed.train()
    resumed.run_dir.release()
    return {"before": before, "after": after, "base": mismatches, "output": output, "start": start}


def _losses(root: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (root / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows}


def test_lora_trains_resumes_and_exports_for_diffusers_and_comfyui(tmp_path, distributed, readme):
    # The README's LoRA training (its config, on 2 ranks), in-process so that the trained model can be probed.
    module, nproc, args = readme.launched(
        readme.command(
            WAN_README, TRAIN, paths={"apps/wan22-train/configs": config_path("tiny_t2v_lora.yaml").parent}
        )
    )
    assert (module, args[0]) == ("wan22_train", "--config")
    tiny = make_tiny(tmp_path / "tiny")
    overrides = [
        *tiny_overrides(tiny),
        f"training.save={tmp_path / 'ckpt'}",
        f"training.train_iters={STEPS}",
        f"training.save_interval={SAVE_AT}",
        "model.models.predictor.lora.alpha=8",  # scale alpha / rank = 2: an export that drops it differs
    ]
    results = distributed(
        _train_and_probe, nproc, overrides, str(tmp_path / "resumed"), str(tiny), args[1], timeout=600
    )
    first = results[0]
    print("fixed-draw loss before / after:", first["before"], first["after"])
    assert first["after"] < 0.9 * first["before"], (first["before"], first["after"])
    assert all(r["base"] == [] for r in results), [r["base"] for r in results]
    assert first["start"] == SAVE_AT
    uninterrupted, resumed = _losses(tmp_path / "ckpt"), _losses(tmp_path / "resumed")
    assert sorted(resumed) == list(range(SAVE_AT + 1, STEPS + 1))
    assert [resumed[s] for s in resumed] == [uninterrupted[s] for s in resumed]

    # The checkpoint holds the adapters only.
    from torch.distributed.checkpoint import FileSystemReader

    keys = FileSystemReader(str(tmp_path / "ckpt" / f"iter_{STEPS:07d}")).read_metadata().state_dict_metadata
    model_keys = [k for k in keys if k.startswith("model.")]
    assert model_keys and all(".lora_A." in k or ".lora_B." in k for k in model_keys), model_keys[:5]

    from diffusers import (
        AutoencoderKLWan,
        FlowMatchEulerDiscreteScheduler,
        WanPipeline,
        WanTransformer3DModel,
    )
    from mm_trainer import load_run_config
    from transformers import AutoTokenizer, UMT5EncoderModel
    from wan22_train.export import export_lora

    config = load_run_config(tmp_path / "ckpt")
    ours = first["output"]
    x, t, text = _inputs()

    # (a) PEFT / diffusers (the README's export line): WanPipeline.load_lora_weights on the tiny pipeline.
    from wan22_train.cli import main as wan22_main

    paths = {"runs/tiny_lora/ckpt": tmp_path / "ckpt", "runs/tiny_lora/peft": tmp_path / "peft"}
    assert wan22_main(readme.command(WAN_README, EXPORT, paths=paths)[1:]) == 0
    peft_dir = tmp_path / "peft"

    pipe = WanPipeline(
        tokenizer=AutoTokenizer.from_pretrained(tiny / "tokenizer"),
        text_encoder=UMT5EncoderModel.from_pretrained(tiny / "text_encoder"),
        vae=AutoencoderKLWan.from_pretrained(tiny / "vae"),
        transformer=WanTransformer3DModel.from_pretrained(tiny / "transformer").eval(),
        scheduler=FlowMatchEulerDiscreteScheduler(),
    )
    pipe.load_lora_weights(str(peft_dir))
    with torch.no_grad():
        torch.testing.assert_close(
            pipe.transformer(x, t, text, return_dict=False)[0], ours, rtol=1e-5, atol=1e-5
        )

    # (b) ComfyUI: official Wan module names, lora_down / lora_up / alpha; diffusers' converter for that
    # layout reads the same file into the same outputs.
    comfy = export_lora(config, tmp_path / "ckpt", tmp_path / "wan_lora_comfy.safetensors", fmt="comfyui")
    with safe_open(str(comfy), "pt") as f:
        comfy_keys = list(f.keys())
    assert comfy_keys and all(COMFY_KEY.fullmatch(k) for k in comfy_keys), comfy_keys[:5]
    assert len(comfy_keys) == 3 * 2 * 10  # 2 blocks x 10 layers x (down, up, alpha)
    comfy_transformer = WanTransformer3DModel.from_pretrained(tiny / "transformer").eval()
    pipe.transformer = comfy_transformer
    pipe.load_lora_weights(str(comfy), adapter_name="comfy")
    with torch.no_grad():
        torch.testing.assert_close(
            comfy_transformer(x, t, text, return_dict=False)[0], ours, rtol=1e-5, atol=1e-5
        )

    # `wan22-train sample` reads the base from its source and the adapters from the checkpoint.
    from wan22_train.sampling import load_for_sampling

    with torch.no_grad():
        sampled = load_for_sampling(config, tmp_path / "ckpt")["predictor"](x, t, text)
    torch.testing.assert_close(sampled, ours, rtol=1e-5, atol=1e-5)

    # (c) merged: a full diffusers transformer folder.
    merged = export_lora(config, tmp_path / "ckpt", tmp_path / "merged", fmt="merged")
    with torch.no_grad():
        out = WanTransformer3DModel.from_pretrained(merged).eval()(x, t, text, return_dict=False)[0]
    torch.testing.assert_close(out, ours, rtol=1e-5, atol=1e-5)
