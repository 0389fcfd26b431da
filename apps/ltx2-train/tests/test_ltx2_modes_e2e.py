"""The README's LTX-2 training modes, each run 2 steps through ``ltx2-train``'s main on the tiny cache: a
frozen modality (the video trained with the audio branch frozen, and audio-only T2A) leaves the frozen
branch's weights as they were loaded and moves the other's; every run's ``metrics.jsonl`` has the loss of
each modality beside the total, which is the trained modalities' sum. The IC-LoRA lines run as a chain:
preprocess with the references, train, sample with a reference. The clean-context lines (A2V, V2A, audio
extension) run in one process on one rank, the transformer's inputs recorded: the clean stream is the
cached latents themselves at timestep 0, and no loss is taken on it."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from ltx2_train.modality import branch_parameters

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]

README = "apps/ltx2-train/README.md"
TINY = "apps/ltx2-train/configs/tiny_t2av.yaml"
VIDEO_ONLY = "torchrun --standalone --nproc-per-node 2 -m ltx2_train --config apps/ltx2-train/configs/tiny_t2av.yaml model.pipeline.frozen_modality=audio training.save=runs/ltx2_tiny/ckpt_video_only"
AUDIO_ONLY = "torchrun --standalone --nproc-per-node 2 -m ltx2_train --config apps/ltx2-train/configs/tiny_t2av.yaml model.pipeline.frozen_modality=video training.save=runs/ltx2_tiny/ckpt_audio_only"
EXTENSION = "torchrun --standalone --nproc-per-node 2 -m ltx2_train --config apps/ltx2-train/configs/tiny_t2av_extension.yaml"
IC_LORA_CONFIG = "apps/ltx2-train/configs/tiny_t2av_ic_lora.yaml"
IC_LORA_PREPROCESS = "ltx2-train preprocess --config apps/ltx2-train/configs/tiny_t2av_ic_lora.yaml"
IC_LORA = "torchrun --standalone --nproc-per-node 2 -m ltx2_train --config apps/ltx2-train/configs/tiny_t2av_ic_lora.yaml"
IC_LORA_SAMPLE = 'ltx2-train sample --checkpoint runs/ltx2_tiny/ckpt_ic_lora --prompt "a red circle moving up" --reference runs/ltx2_tiny/data/references/clip_0000.mp4 --out runs/ltx2_tiny/sample_ic_lora.mp4'
INDEPENDENT = "torchrun --standalone --nproc-per-node 2 -m ltx2_train --config apps/ltx2-train/configs/tiny_t2av.yaml model.pipeline.audio_timesteps=independent training.save=runs/ltx2_tiny/ckpt_independent"
A2V = "torchrun --standalone --nproc-per-node 2 -m ltx2_train --config apps/ltx2-train/configs/tiny_t2av.yaml model.pipeline.condition_modality=audio training.save=runs/ltx2_tiny/ckpt_a2v"
V2A = "torchrun --standalone --nproc-per-node 2 -m ltx2_train --config apps/ltx2-train/configs/tiny_t2av.yaml model.pipeline.condition_modality=video training.save=runs/ltx2_tiny/ckpt_v2a"
AUDIO_EXTENSION = "torchrun --standalone --nproc-per-node 2 -m ltx2_train --config apps/ltx2-train/configs/tiny_t2av.yaml model.pipeline.audio_conditioning_frames=4 training.save=runs/ltx2_tiny/ckpt_audio_extension"
CLEAN_AUDIO_FRAMES = 4  # AUDIO_EXTENSION's audio_conditioning_frames


def run_readme_line(
    line: str, name: str, readme, ltx2_train, tiny_cache, run_config, config: str = TINY
) -> SimpleNamespace:
    """The README line on the tests' tiny cache (its ``config``'s paths moved there), shortened to 2 steps
    and saved under the cache: the checkpoint's weights and the metrics records."""
    save = tiny_cache / name
    moved = run_config(tiny_cache, REPO / config)
    argv = readme.command(README, line, paths={config: moved},
                          extra=("training.train_iters=2", f"training.save={save}"))  # fmt: skip
    _, nproc, args = readme.launched(argv)
    ltx2_train(*args, nproc=nproc)
    rows = [json.loads(line) for line in (save / "metrics.jsonl").read_text().splitlines()]
    return SimpleNamespace(
        rows=[r for r in rows if "loss" in r], weights=checkpoint_weights(save / "iter_0000002")
    )


def checkpoint_weights(ckpt: Path) -> dict[str, torch.Tensor]:
    """The transformer's weights in a DCP checkpoint, by upstream key."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    flat = ckpt.parent / "flat.pt"
    dcp_to_torch_save(ckpt, flat)
    return {k.removeprefix("model."): v for k, v in torch.load(flat, weights_only=False)["model"].items()}


def changed_by_branch(tiny_cache: Path, trained: dict[str, torch.Tensor]) -> dict[str, set[str]]:
    """``{"video": ..., "audio": ...}``: the parameters of each branch whose trained value differs from
    the model set's transformer (what the run loaded)."""
    from diffusers import LTX2VideoTransformer3DModel

    initial = LTX2VideoTransformer3DModel.from_pretrained(tiny_cache / "transformer")
    return {
        modality: {
            n for n, p in branch_parameters(initial, modality).items() if not torch.equal(trained[n], p)
        }
        for modality in ("video", "audio")
    }


@pytest.mark.parametrize(
    ("line", "frozen"), [(VIDEO_ONLY, "audio"), (AUDIO_ONLY, "video")], ids=["video only", "audio only (T2A)"]
)
def test_a_frozen_modality_run_leaves_that_branch_as_loaded_and_trains_the_other(
    line, frozen, readme, ltx2_train, tiny_cache, run_config
):
    run = run_readme_line(line, f"frozen_{frozen}", readme, ltx2_train, tiny_cache, run_config)
    changed = changed_by_branch(tiny_cache, run.weights)
    trained = "video" if frozen == "audio" else "audio"
    assert not changed[frozen], sorted(changed[frozen])
    assert changed[trained], "the trained branch did not move"
    assert [r["step"] for r in run.rows] == [1, 2]
    for row in run.rows:  # the loss is the trained modality's; the frozen one's is reported beside it
        assert row["loss_video"] > 0 and row["loss_audio"] > 0
        expected = row["loss_video"] if trained == "video" else row["loss_audio"]  # audio_loss_weight 1
        assert row["loss"] == pytest.approx(expected, rel=1e-5), row


def test_an_independent_timesteps_run_trains_both_and_logs_each_modalitys_loss(
    readme, ltx2_train, tiny_cache, run_config
):
    run = run_readme_line(INDEPENDENT, "independent", readme, ltx2_train, tiny_cache, run_config)
    changed = changed_by_branch(tiny_cache, run.weights)
    assert changed["video"] and changed["audio"]
    for row in run.rows:
        assert row["loss"] == pytest.approx(row["loss_video"] + row["loss_audio"], rel=1e-5), row


def test_a_video_extension_run_trains_on_the_frames_after_the_conditioning_ones(
    readme, ltx2_train, tiny_cache, run_config
):
    """The extension config (2 of 3 latent frames given clean) through the trainer at Ulysses 2: the
    per-token timesteps are split with the tokens; which tokens carry no loss is the pipeline's
    (test_ltx2_pipeline.py: test_video_extension_*)."""
    config = "apps/ltx2-train/configs/tiny_t2av_extension.yaml"
    run = run_readme_line(EXTENSION, "extension", readme, ltx2_train, tiny_cache, run_config, config)
    assert [r["step"] for r in run.rows] == [1, 2]
    for row in run.rows:
        assert row["loss"] == pytest.approx(row["loss_video"] + row["loss_audio"], rel=1e-5), row


def test_an_ic_lora_run_preprocesses_its_references_trains_with_them_and_samples_with_one(
    readme, ltx2_train, tiny_cache, run_config, tmp_path, capsys
):
    """The README's IC-LoRA chain on the tests' model set: preprocess caches each clip's reference (video and
    audio latents), 2 steps train the adapters with them in context, and ``sample --reference`` draws a clip
    (that another reference changes the prediction is checked at the pipeline: test_ltx2_conditioning.py)."""
    from ltx2_train.cli import main
    from mm_data import PrecomputedLatentDataset

    config = run_config(tiny_cache, REPO / IC_LORA_CONFIG)
    argv = readme.command(README, IC_LORA_PREPROCESS, paths={IC_LORA_CONFIG: config})
    assert main(argv[1:]) == 0
    cached = PrecomputedLatentDataset(tiny_cache / "latents_ic_lora")[0]
    assert cached["reference_latents"].shape == cached["latents"].shape
    assert cached["reference_audio_latents"].shape == cached["audio_latents"].shape
    assert not torch.equal(cached["reference_latents"], cached["latents"])  # the reversed motion
    run = run_readme_line(IC_LORA, "ckpt_ic_lora", readme, ltx2_train, tiny_cache, run_config, IC_LORA_CONFIG)
    assert [r["step"] for r in run.rows] == [1, 2]
    out = tmp_path / "sample.mp4"
    paths = {"runs/ltx2_tiny/ckpt_ic_lora": tiny_cache / "ckpt_ic_lora", "runs/ltx2_tiny/data": tiny_cache / "data",
             "runs/ltx2_tiny/sample_ic_lora.mp4": out}  # fmt: skip
    argv = readme.command(README, IC_LORA_SAMPLE, paths=paths, extra=("--steps", "1"))
    assert main(argv[1:]) == 0
    assert capsys.readouterr().out.split()[-2:] == [str(out), str(out.with_suffix(".wav"))]


def _clean_context_runs(rank: int, world: int, runs: dict[str, list[str]]) -> dict[str, list[dict]]:
    """Each argv of ``runs`` through ``ltx2-train``'s main, one after the other in this process (each a
    run of its own on a fresh 1-rank group), with the transformer's inputs and outputs of every forward."""
    import logging
    import os

    from ltx2_train.cli import main
    from ltx2_train.predictor import LTX2Predictor

    logging.root.handlers.clear()  # as in a fresh interpreter (run_main_forked)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        os.environ.pop(name)  # after the first run closes its group, the next starts one without torchrun
    seen: list[dict] = []
    keys = ("hidden_states", "audio_hidden_states", "timestep", "audio_timestep")

    def record(module: torch.nn.Module, _args: tuple, kwargs: dict, output: tuple) -> None:
        if isinstance(module, LTX2Predictor):
            seen.append({k: kwargs[k].detach().clone() for k in keys} | {
                "video_out": output[0].detach().clone(), "audio_out": output[1].detach().clone()})  # fmt: skip

    handle = torch.nn.modules.module.register_module_forward_hook(record, with_kwargs=True)
    out = {}
    try:
        for name, argv in runs.items():
            assert main(argv) == 0, name
            out[name], seen[:] = list(seen), []
    finally:
        handle.remove()
    return out


def _clean_of(row: torch.Tensor, clean: list[torch.Tensor], tokens: int | None = None) -> torch.Tensor | None:
    """The clean tokens of the cached sample whose first ``tokens`` (all when None) ``row`` holds exactly,
    None when no sample's. (Two tiny clips may share a stand-in tone, hence their audio: either is the one.)"""
    return next((c for c in clean if torch.equal(row[:tokens], c[:tokens])), None)


@pytest.fixture(scope="module")
def clean_context_runs(readme, tiny_cache, run_config, distributed):
    """The README's A2V, V2A and audio-extension lines, 2 steps each on one rank (``nproc 1``,
    ``parallel.ulysses_parallel_size=1``), in one forked process: their ``metrics.jsonl`` loss records and
    the transformer's recorded forwards. CI time: no checkpoint and no TensorBoard events (a quarter of each
    run's time), the metrics under ``training.log_dir``; what is checked is in the forwards and the metrics."""
    config = run_config(tiny_cache, REPO / TINY)
    runs = {}
    for name, line in (("a2v", A2V), ("v2a", V2A), ("audio_extension", AUDIO_EXTENSION)):
        logs = tiny_cache / f"clean_{name}"
        extra = ("training.train_iters=2", "training.save=null", f"training.log_dir={logs}",
                 "training.tensorboard=false", "parallel.ulysses_parallel_size=1")  # fmt: skip
        argv = readme.command(README, line, paths={TINY: config}, extra=extra)
        runs[name] = readme.launched(argv)[2]
    forwards = distributed(_clean_context_runs, 1, runs, timeout=600)[0]
    out = {}
    for name, calls in forwards.items():
        rows = [
            json.loads(line)
            for line in (tiny_cache / f"clean_{name}" / "metrics.jsonl").read_text().splitlines()
        ]
        out[name] = SimpleNamespace(rows=[r for r in rows if "loss" in r], forwards=calls)
    return out


@pytest.fixture(scope="module")
def clean_tokens(tiny_cache):
    """``(video, audio)``: each cached sample's clean latents as the transformer's tokens."""
    from diffusers import LTX2VideoTransformer3DModel
    from ltx2_train.pipeline import pack_audio, pack_video
    from mm_data import PrecomputedLatentDataset

    config = LTX2VideoTransformer3DModel.load_config(tiny_cache / "transformer")
    cache = PrecomputedLatentDataset(tiny_cache / "latents")
    patch = config["patch_size"], config["patch_size_t"]
    video = [pack_video(cache[i]["latents"][None], *patch)[0] for i in range(len(cache))]
    audio = [pack_audio(cache[i]["audio_latents"][None])[0] for i in range(len(cache))]
    return video, audio


@pytest.mark.parametrize(("name", "clean", "trained"), [("a2v", "audio", "video"), ("v2a", "video", "audio")])
def test_a_clean_modality_run_gives_that_stream_as_cached_at_timestep_0_and_logs_only_the_others_loss(
    name, clean, trained, clean_context_runs, clean_tokens
):
    """A2V (``condition_modality=audio``): the transformer gets every sample's audio latents as cached (not
    noised) at timestep 0 and the video noised; only the video loss is taken and logged. V2A: the reverse."""
    run = clean_context_runs[name]
    assert [r["step"] for r in run.rows] == [1, 2] and len(run.forwards) == 2
    streams = {
        "video": ("hidden_states", "timestep", 0),
        "audio": ("audio_hidden_states", "audio_timestep", 1),
    }
    for call in run.forwards:
        inputs, timestep, which = streams[clean]
        assert all(_clean_of(row, clean_tokens[which]) is not None for row in call[inputs])
        assert not call[timestep].any()
        inputs, timestep, which = streams[trained]
        assert all(_clean_of(row, clean_tokens[which]) is None for row in call[inputs])  # noised
        assert (call[timestep] > 0).all()
    for row in run.rows:
        assert f"loss_{clean}" not in row, row
        assert row["loss"] == pytest.approx(row[f"loss_{trained}"], rel=1e-6), row


def test_an_audio_extension_run_gives_the_first_audio_frames_clean_and_takes_no_loss_on_them(
    clean_context_runs, clean_tokens
):
    """``audio_conditioning_frames=4``: each sample's first 4 audio tokens (one per latent frame) are its
    cached latents at timestep 0, the rest noised; the logged audio loss is the MSE of the transformer's
    audio output against the flow target ``eps - x0`` over the noised tokens alone (``eps`` recovered from
    the noised input: ``x = (1 - s) x0 + s eps``), and the loss is the video's plus the audio's."""
    _, clean_audio = clean_tokens
    k = CLEAN_AUDIO_FRAMES
    run = clean_context_runs["audio_extension"]
    assert [r["step"] for r in run.rows] == [1, 2] and len(run.forwards) == 2
    for call, row in zip(run.forwards, run.rows, strict=True):
        x, t = call["audio_hidden_states"], call["audio_timestep"]
        assert x.shape[1] > k and t.shape == x.shape[:2]  # a timestep per audio token
        assert not t[:, :k].any() and (t[:, k:] > 0).all()
        cached = [_clean_of(r, clean_audio, k) for r in x]  # whose first k tokens each row holds exactly
        assert all(c is not None for c in cached)
        x0 = torch.stack(cached)
        assert not torch.isclose(x[:, k:], x0[:, k:]).all(dim=-1).any()  # every generated token noised
        s = (t[:, k:] / 1000)[..., None]
        target = (x[:, k:] - (1 - s) * x0[:, k:]) / s - x0[:, k:]
        mse = (call["audio_out"][:, k:] - target).pow(2).mean().item()
        assert row["loss_audio"] == pytest.approx(mse, rel=1e-4), (row, mse)
        assert row["loss"] == pytest.approx(row["loss_video"] + row["loss_audio"], rel=1e-5), row
