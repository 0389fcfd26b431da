"""Tiny LTX-2 end to end on 2 gloo processes (FSDP2 + Ulysses 2, audio on): train, resume (also at world 1),
export; MFU, condition_micro_steps and ring attention against the same reference run; a run of the
learning recipe (``ltx2_train.tiny.LEARN_TRAINING``) whose samples move as captioned.

The reference run is the one real ``torchrun -m ltx2_train`` launch of this app's tests (the console
entry and launcher path); every other run is ``ltx2-train``'s ``main`` on forked gloo ranks (the
``main_forked`` fixture): the command line's code path without a fresh interpreter per run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from ltx2_train.tiny import CLIP, LEARN_TRAINING, load_clips

pytestmark = pytest.mark.slow

STEPS = 16  # the reference: checkpoints at 8 and 16, constant lr (its first steps are any shorter run's)


def ltx2_train_torchrun(*args: str, nproc: int) -> None:
    """Run the ``ltx2-train`` CLI under torchrun; fail with its output if it fails."""
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, *launcher, "-m", "ltx2_train", *args], env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    if proc.returncode != 0:
        pytest.fail(
            f"ltx2-train {args} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
        )


def losses(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


@pytest.fixture(scope="module")
def reference(tiny_cache, run_config) -> SimpleNamespace:
    """16 steps on 2 ranks (Ulysses 2) under torchrun, checkpoints at 8 and 16, ``peak_flops`` set."""
    config = run_config(
        tiny_cache, train_iters=STEPS, save_interval=8, keep_last=2, deterministic=True, peak_flops=1e12
    )
    ltx2_train_torchrun("--config", str(config), nproc=2)
    ckpt = tiny_cache / "ckpt"
    rows = [json.loads(line) for line in (ckpt / "metrics.jsonl").read_text().splitlines()]
    return SimpleNamespace(config=config, ckpt=ckpt, losses=losses(ckpt), rows=rows)


@pytest.fixture(scope="module")
def learned(tiny_cache, ltx2_train, run_config) -> SimpleNamespace:
    """A fresh run of ``LEARN_TRAINING`` on the tiny cache and its modules for sampling
    (``ltx2_train.sampling.load_for_sampling``). One rank without recompute: at this size a step is
    all overhead, which the all-to-alls and recompute of Ulysses 2 would ~triple."""
    from ltx2_train.sampling import load_for_sampling
    from mm_trainer import load_run_config

    save = tiny_cache / "learned"
    config = run_config(tiny_cache, save=str(save), save_interval=1000)  # saved once, at the last step
    ltx2_train(
        "--config", str(config), *LEARN_TRAINING, "parallel.ulysses_parallel_size=1",
        "features.recompute_plan.apply_modules=[]",
    )  # fmt: skip
    return SimpleNamespace(ckpt=save, modules=load_for_sampling(load_run_config(save), save))


def trained_predictor(ckpt: Path) -> torch.nn.Module:
    """The trained weights read straight from the DCP checkpoint into the upstream-class predictor."""
    from ltx2_train.predictor import LTX2Predictor
    from ltx2_train.tiny import TINY_TRANSFORMER, one_token_patch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    flat = ckpt.parent / "flat.pt"
    dcp_to_torch_save(ckpt, flat)
    state = torch.load(flat, weights_only=False)["model"]
    model = LTX2Predictor.build_from_config(
        SimpleNamespace(config=TINY_TRANSFORMER | one_token_patch(), from_pretrained=None)
    )
    model.load_state_dict({k.removeprefix("model."): v for k, v in state.items()})
    return model.eval()


LTX2_README = "apps/ltx2-train/README.md"
MAKE_TINY_SINGLE_FILE = "ltx2-train make-tiny runs/ltx2_tiny --single-file"
EXPORT = "ltx2-train export --checkpoint runs/ltx2_tiny/ckpt --out runs/ltx2_tiny/export/transformer"
SAMPLE = 'ltx2-train sample --checkpoint runs/ltx2_tiny/ckpt --prompt "a red circle moving up" --out runs/ltx2_tiny/sample.mp4'


def test_train_resume_and_export(reference, ltx2_train, tiny_cache, one_token_inputs, readme):
    from diffusers import LTX2VideoTransformer3DModel

    # 1. Train 16 steps, checkpoints at 8 and 16: finite, decreasing loss.
    config, ckpt, first = reference.config, reference.ckpt, reference.losses
    assert sorted(first) == list(range(1, 17))
    values = list(first.values())
    assert all(torch.isfinite(torch.tensor(values)))
    assert sum(values[-4:]) / 4 < 0.8 * sum(values[:4]) / 4, values

    # 2. Resume from iteration 8 in a fresh folder: steps 9..16 repeat the uninterrupted run.
    resume_from = tiny_cache / "resume_from"
    shutil.copytree(ckpt / "iter_0000008", resume_from / "iter_0000008")
    (resume_from / "latest_checkpointed_iteration.txt").write_text("8")
    resumed_dir = tiny_cache / "resumed"
    ltx2_train(
        "--config", str(config), f"training.load={resume_from}", f"training.save={resumed_dir}", nproc=2
    )
    resumed = losses(resumed_dir)
    assert sorted(resumed) == list(range(9, 17))
    for step, loss in resumed.items():
        assert loss == pytest.approx(first[step], rel=1e-5), (step, loss, first[step])

    # 2b. The same checkpoint resumed at another layout, world 1 without Ulysses: steps 9..16 again.
    single_dir = tiny_cache / "resumed_world_1"
    ltx2_train(
        "--config", str(config), f"training.load={resume_from}", f"training.save={single_dir}",
        "parallel.ulysses_parallel_size=1",
    )  # fmt: skip
    single = losses(single_dir)
    assert sorted(single) == list(range(9, 17))
    for step, loss in single.items():
        assert loss == pytest.approx(first[step], rel=1e-4), (step, loss, first[step])

    # 3. Export: upstream from_pretrained loads it and computes what the trained weights compute.
    out = tiny_cache / "export" / "transformer"
    ltx2_train(
        *readme.command(
            LTX2_README, EXPORT, paths={"runs/ltx2_tiny/ckpt": ckpt, "runs/ltx2_tiny/export": out.parent}
        )[1:]
    )
    exported = LTX2VideoTransformer3DModel.from_pretrained(out).eval()
    assert type(exported) is LTX2VideoTransformer3DModel
    trained = trained_predictor(ckpt / "iter_0000016")
    initial = LTX2VideoTransformer3DModel.from_pretrained(tiny_cache / "transformer")
    assert not torch.equal(initial.proj_out.weight, exported.proj_out.weight)  # training changed it
    with torch.no_grad():
        want = trained(**one_token_inputs(), return_dict=False)
        got = exported(**one_token_inputs(), return_dict=False)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_a_run_from_an_official_release_file_trains_the_losses_of_the_diffusers_folder(
    reference, ltx2_train, tiny_cache, run_config, tmp_path, readme
):
    # the reference's model set written as one official release file (transformer, VAEs, vocoder and
    # connectors under their official names, the official config metadata); preprocess reads the VAEs and
    # connectors from it, training the transformer; what the metadata cannot say (diffusers-only arguments:
    # patch sizes, VAE factors, audio rate) comes from model.config, the components' configs from model_root
    import yaml
    from diffusers import AutoencoderKLLTX2Video, LTX2VideoTransformer3DModel
    from diffusers.loaders.single_file_utils import convert_ltx2_transformer_to_diffusers
    from ltx2_train.cli import main
    from ltx2_train.official import CONNECTORS, OFFICIAL_PREFIX, read_single_file_config
    from ltx2_train.predictor import INIT_KEYS
    from ltx2_train.preprocess import run_preprocess
    from ltx2_train.release_file import load_release_encoders
    from ltx2_train.tiny import RELEASE_FILE
    from mm_config import load_config
    from safetensors.torch import load_file

    made = tiny_cache / RELEASE_FILE
    command = readme.command(LTX2_README, MAKE_TINY_SINGLE_FILE, paths={"runs/ltx2_tiny": tiny_cache})
    assert main(command[1:]) == 0
    single = tmp_path / RELEASE_FILE
    made.rename(single)
    state = load_file(single)
    assert {k.split(".")[0] for k in state} == {
        "model",
        "vae",
        "audio_vae",
        "vocoder",
        "text_embedding_projection",
    }
    connectors = tuple(OFFICIAL_PREFIX + c for c in CONNECTORS)
    transformer = {
        k: v for k, v in state.items() if k.startswith(OFFICIAL_PREFIX) and not k.startswith(connectors)
    }
    folder = tiny_cache / "transformer"
    weights = load_file(folder / "diffusion_pytorch_model.safetensors")
    assert sorted(convert_ltx2_transformer_to_diffusers(transformer)) == sorted(weights)
    # diffusers' from_single_file reads its transformer and video VAE as the folders hold them; the release
    # reader (diffusers' audio VAE converter, our connector names) the audio VAE and connectors
    for cls, sub in ((AutoencoderKLLTX2Video, "vae"), (LTX2VideoTransformer3DModel, "transformer")):
        loaded = cls.from_single_file(
            str(single), config=str(tiny_cache), subfolder=sub, local_files_only=True
        )
        want = cls.from_pretrained(tiny_cache / sub).state_dict()
        assert all(torch.equal(v, want[k]) for k, v in loaded.state_dict().items()), sub
    _, audio_vae, connectors = load_release_encoders(single, tiny_cache, audio=True, dtype=torch.float32)
    for part, sub in ((audio_vae, "audio_vae"), (connectors, "connectors")):
        want = load_file(tiny_cache / sub / "diffusion_pytorch_model.safetensors")
        assert sorted(part.state_dict()) == sorted(want), sub
        assert all(torch.equal(v, want[k]) for k, v in part.state_dict().items()), sub

    save, cache = tmp_path / "single", tmp_path / "latents"
    config = run_config(tiny_cache, train_iters=4, save_interval=4, deterministic=True, save=str(save))
    cfg = yaml.safe_load(config.read_text())
    shape = {k: v for k, v in json.loads((folder / "config.json").read_text()).items() if k in INIT_KEYS}
    rest = {k: v for k, v in shape.items() if k not in read_single_file_config(single)}
    cfg["model"].update(from_pretrained=str(single), load_format="auto", config=rest)
    cfg["data"]["data_path"] = str(cache)
    cfg["data"]["dataset"]["preprocess"]["release_file"] = str(single)
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    assert run_preprocess(
        load_config(config, ["parallel.ulysses_parallel_size=1"], world_size=1)
    ).computed == [0, 1, 2, 3]
    ltx2_train("--config", str(config), nproc=2)
    got = losses(save)
    assert sorted(got) == [1, 2, 3, 4]
    assert got == {step: reference.losses[step] for step in got}


def test_conditions_shared_across_the_ulysses_group_train_the_same_losses(
    reference, ltx2_train, tiny_cache, run_config, tmp_path
):
    # LTX-2's conditions mix tensors with plain values (the latent grid, the frame rate); the reference
    # (condition_micro_steps 1) is the plain run
    save = tmp_path / "ahead"
    config = run_config(tiny_cache, train_iters=6, save_interval=6, deterministic=True, save=str(save))
    ltx2_train("--config", str(config), "features.condition_micro_steps=2", nproc=2)
    ahead = losses(save)
    assert sorted(ahead) == list(range(1, 7))
    assert ahead == {step: reference.losses[step] for step in ahead}


def test_ring_attention_trains_the_losses_of_ulysses(reference, ltx2_train, tiny_cache, run_config, tmp_path):
    # the same context-parallel group of 2 as the reference, sequence split for the ring instead of all-to-all
    save = tmp_path / "ring"
    config = run_config(tiny_cache, train_iters=4, save_interval=4, deterministic=True, save=str(save))
    layout = ("parallel.ulysses_parallel_size=1", "parallel.ring_attention_size=2")
    ltx2_train("--config", str(config), *layout, nproc=2)
    ring = losses(save)
    assert sorted(ring) == [1, 2, 3, 4]
    for step, loss in ring.items():
        assert loss == pytest.approx(reference.losses[step], rel=1e-4), (step, loss, reference.losses[step])


def test_a_tiny_run_reports_mfu_from_the_predictor_flops(reference):
    # CPUs have no peak-FLOPs entry; the reference sets training.peak_flops, so MFU = flops / time / peak
    steps = [r for r in reference.rows if "loss" in r]
    assert len(steps) == STEPS and all(0 < r["mfu"] < 1 for r in steps), steps


def test_sample_writes_a_clip_and_its_audio_the_same_for_a_seed(reference, tmp_path, capsys, readme):
    import av
    from ltx2_train.cli import main

    def sample(seed: int, name: str) -> tuple[bytes, bytes]:
        out = tmp_path / f"{name}.mp4"
        paths = {
            "runs/ltx2_tiny/ckpt": reference.ckpt,
            "runs/ltx2_tiny/sample.mp4": out,
        }  # the README's, shortened:
        argv = readme.command(LTX2_README, SAMPLE, paths=paths, extra=("--steps", "4", "--seed", str(seed)))
        assert main(argv[1:]) == 0
        assert capsys.readouterr().out.split() == [str(out), str(out.with_suffix(".wav"))]
        return out.read_bytes(), out.with_suffix(".wav").read_bytes()

    first, again, other = sample(0, "a"), sample(0, "b"), sample(1, "c")
    with av.open(str(tmp_path / "a.mp4")) as clip:
        frames = [f.to_ndarray(format="rgb24") for f in clip.decode(video=0)]
    assert len(frames) == CLIP["num_frames"] and frames[0].shape == (CLIP["height"], CLIP["width"], 3)
    assert first == again and first[0] != other[0] and first[1] != other[1]


def test_a_sample_for_each_training_caption_moves_as_captioned_and_matches_its_clip(
    learned, tiny_cache, euler_step
):
    from ltx2_train.sampling import sample_clip
    from mm_data import moves_as_captioned, psnr, to_video_frames
    from mm_trainer import reconstruct
    from mm_trainer.registry.registries import DATA_REGISTRY

    cached = DATA_REGISTRY.get("ltx2_precomputed")(data_path=tiny_cache / "latents")
    clips = load_clips(tiny_cache / "data" / "metadata.json")
    reconstructions = reconstruct(learned.modules["encoders"].vae, clips).clamp(-1, 1)
    size = {k: CLIP[k] for k in ("num_frames", "height", "width")}
    moved, quality = [], {}
    for index in range(len(cached)):
        caption = cached[index]["prompt"]  # the caption the clip was trained with
        video, _ = sample_clip(learned.modules, caption, **size, frame_rate=CLIP["fps"], steps=20, seed=0)
        moved.append(moves_as_captioned(to_video_frames(video), caption))
        quality[caption] = round(
            psnr(video, reconstructions[index]), 2
        )  # dB against the VAE's reconstruction
    print(f"sample PSNR against the VAE's reconstruction of the clip: {quality}")
    assert len(moved) == 4 and all(moved), (moved, quality)
    assert min(quality.values()) >= 18.0, quality
