"""``data.packing``: the tiny Wan T2V run trained on packed micro-batches (samples of different shapes in
one sequence, spread over micro-steps by tokens) logs the losses of the unpacked run."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from mm_data import make_synthetic_dataset
from mm_trainer.run.exit_codes import EXIT_CONFIG, EXIT_INPUT
from wan22_train.cli import main as wan22_main
from wan22_train.configs import config_path
from wan22_train.tiny import make_tiny, tiny_overrides

pytestmark = pytest.mark.slow

BUDGET = "data.packing.token_budget=4096"
MIXED_SIZES = [(32, 32), (32, 48), (48, 32)]
MIXED_BUCKETS = "data.dataset.buckets=[[32,32,1],[32,48,9],[48,32,9]]"


def argv_of(tiny: Path, save: Path, *overrides: str, config: str = "tiny_t2v.yaml") -> list[str]:
    """The tiny run's command line: one step, no checkpoint, ``overrides`` last."""
    return ["--config", str(config_path(config)), *tiny_overrides(tiny), f"training.save={save}",
            "training.train_iters=1", "training.save_interval=100", "parallel.ulysses_parallel_size=1",
            "data.dataset.frame_offset=start", *overrides]  # fmt: skip


def train(
    main_forked, tiny: Path, save: Path, *overrides: str, nproc: int = 1, config: str = "tiny_t2v.yaml"
) -> list[float]:
    main_forked(wan22_main, argv_of(tiny, save, *overrides, config=config), nproc=nproc)
    return [json.loads(line)["loss"] for line in (save / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return make_tiny(tmp_path_factory.mktemp("tiny"))


@pytest.mark.parametrize("config", ["tiny_t2v.yaml", "tiny_t2v_lora.yaml", "tiny_t2v_both.yaml"])
def test_a_packed_step_logs_the_unpacked_steps_loss(tiny, tmp_path, main_forked, config):
    """Full fine-tuning, LoRA, and both A14B experts (a step's samples share its grid index, so a packed
    micro-batch goes whole to one expert: the step's)."""
    batch = ["training.global_batch_size=4", "training.micro_batch_size=2"]
    if config == "tiny_t2v_both.yaml":
        batch.append(f"model.models.predictor_low.from_pretrained={tiny / 'transformer'}")
    unpacked = train(main_forked, tiny, tmp_path / "unpacked", *batch, config=config)
    packed = train(main_forked, tiny, tmp_path / "packed", *batch, BUDGET, config=config)
    assert abs(packed[0] - unpacked[0]) <= 1e-5 * abs(unpacked[0])


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> list[str]:
    """8 clips of 9 frames cycling 32x32, 32x48, 48x32; the square ones trained as one frame (5 one-frame
    and 3 nine-frame samples, all in the step)."""
    data = make_synthetic_dataset(
        tmp_path_factory.mktemp("mixed"), num_clips=8, sizes=MIXED_SIZES, num_frames=(9,), fps=(8,), seed=0
    )
    return [f"data.data_path={data}", MIXED_BUCKETS, "training.global_batch_size=8", BUDGET]


@pytest.fixture(scope="module")
def mixed_loss(tiny, mixed, tmp_path_factory, main_forked) -> float:
    """The mixed step on one rank in 2 micro-steps filled by tokens (split 3 + 5 samples by count)."""
    return train(main_forked, tiny, tmp_path_factory.mktemp("two"), *mixed, "training.micro_batch_size=4")[0]


def test_a_packed_steps_loss_does_not_depend_on_how_its_samples_split_into_micro_steps(
    tiny, mixed, mixed_loss, tmp_path, main_forked
):
    """8 micro-steps of one sample each, or 2 of 3 and 5 samples: each micro-batch's loss weighs its
    sample count, so the step's loss is still the mean over its samples."""
    eight = train(main_forked, tiny, tmp_path / "eight", *mixed, "training.micro_batch_size=1")
    assert abs(eight[0] - mixed_loss) <= 1e-5 * abs(mixed_loss)


@pytest.mark.parametrize("layout", ["dp2", "ulysses2"])
def test_the_mixed_packed_step_logs_the_same_loss_at_two_ranks(
    tiny, mixed, mixed_loss, tmp_path, main_forked, layout
):
    """Data parallel 2 (each rank its share of the step by tokens, 1 micro-step) or Ulysses 2 (every
    sample of the packed sequence split over the two ranks on its own)."""
    extra = ["parallel.ulysses_parallel_size=2"] if layout == "ulysses2" else []
    loss = train(main_forked, tiny, tmp_path / layout, *mixed, "training.micro_batch_size=4", *extra, nproc=2)
    assert abs(loss[0] - mixed_loss) <= 1e-5 * abs(mixed_loss)


def cli(tiny: Path, save: Path, *overrides: str) -> subprocess.CompletedProcess:
    """The tiny packed run as a user starts it: ``python -m wan22_train`` in a fresh interpreter."""
    args = ["--config", str(config_path("tiny_t2v.yaml")), *tiny_overrides(tiny), f"training.save={save}",
            "training.train_iters=1", "parallel.ulysses_parallel_size=1", "training.global_batch_size=4",
            *overrides]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "wan22_train", *args], env=env, capture_output=True, text=True, timeout=300
    )


def test_a_token_budget_below_a_sample_is_refused_naming_it_before_any_weight_is_read(tiny, tmp_path):
    """Exit 2 (config) with one message naming each sample over the budget (index, file, its 320 tokens)
    and the key, no traceback. The transformer's weights file is garbage: the run at a budget that fits
    fails reading it (exit 66), so the refusal came before any weight was read."""
    bad = tmp_path / "tiny"
    shutil.copytree(tiny, bad)
    (bad / "transformer" / "diffusion_pytorch_model.safetensors").write_bytes(b"not a safetensors file")
    refused = cli(bad, tmp_path / "small", "data.packing.token_budget=8")
    assert refused.returncode == EXIT_CONFIG, refused.stderr[-3000:]
    clip = bad / "data" / "clip_0000.mp4"
    assert (
        f"wan22-train: error: data.packing.token_budget=8 is below the largest sample: sample 0 ({clip}): "
        "320 tokens" in refused.stderr
    ), refused.stderr[-3000:]
    assert "Traceback" not in refused.stderr
    assert not (tmp_path / "small" / "metrics.jsonl").exists()
    fits = cli(bad, tmp_path / "fits", BUDGET)
    assert fits.returncode == EXIT_INPUT and "not a valid safetensors file" in fits.stderr, fits.stderr[
        -3000:
    ]


def records_of(save: Path) -> list[dict]:
    return [json.loads(line) for line in (save / "metrics.jsonl").read_text().splitlines()]


def test_a_packed_run_killed_after_a_checkpoint_resumes_at_data_parallel_2_with_the_uninterrupted_losses(
    tiny, mixed, tmp_path, main_forked, killed_after, capfd
):
    """The mixed set, global batch 4 (2 steps an epoch) on one rank saving every 3 steps, SIGKILLed once it
    logged step 5 (its step-3 checkpoint complete, step 6 not done); rerun on 2 ranks (data parallel 2: each
    rank its share of a step by tokens) it resumes from step 3 and trains steps 4 and 5 on the samples and
    with the losses the killed run logged for them."""
    run = [*mixed[:2], BUDGET, "training.global_batch_size=4", "training.micro_batch_size=2",
           "training.log_sample_ids=true", "training.save_interval=3"]  # fmt: skip
    save = tmp_path / "run"
    status = killed_after(wan22_main, argv_of(tiny, save, *run, "training.train_iters=8"), save, 5)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, f"not killed: status {status}"
    killed = records_of(save)
    assert [r["step"] for r in killed[:5]] == [1, 2, 3, 4, 5] and len(killed) < 8
    assert [i for r in killed[:4] for i in r["sample_ids"]] == list(range(16))  # 2 epochs, each sample once
    capfd.readouterr()
    train(main_forked, tiny, save, *run, "training.train_iters=5", nproc=2)
    assert f"resumed from {save} at iteration 3" in capfd.readouterr().err
    records = records_of(save)
    assert records[:3] == killed[:3]  # kept: the steps up to the checkpoint
    assert [r["step"] for r in records[3:]] == [4, 5]  # the killed run's records past it: replaced
    assert [r["sample_ids"] for r in records[3:]] == [r["sample_ids"] for r in killed[3:5]]
    for ours, theirs in zip(records[3:], killed[3:5], strict=True):
        assert abs(ours["loss"] - theirs["loss"]) <= 1e-5 * abs(theirs["loss"])


@pytest.fixture(scope="module")
def clips_and_images(tmp_path_factory) -> Path:
    """One metadata file of 2 nine-frame 32x32 clips and 2 real 32x32 PNGs beside them (one-frame samples),
    every caption a single text (so a row's draw does not depend on its epoch)."""
    meta = make_synthetic_dataset(tmp_path_factory.mktemp("media"), num_clips=2, sizes=[(32, 32)],
                                  num_frames=(9,), fps=(8,), num_images=2, seed=1)  # fmt: skip
    rows = json.loads(meta.read_text())
    meta.write_text(json.dumps([{**row, "cap": row["cap"][0]} for row in rows]))
    return meta


def test_images_beside_clips_train_packed_with_the_unpacked_steps_losses(
    tiny, clips_and_images, tmp_path, main_forked
):
    """A global batch of 1: step s trains sample s of the epoch's permutation, packed or not; the 4 steps
    are the 2 clips and the 2 images, each within 1e-5 of its unpacked step."""
    run = [f"data.data_path={clips_and_images}", "training.global_batch_size=1", "training.micro_batch_size=1",
           "training.train_iters=4", "training.log_sample_ids=true"]  # fmt: skip
    unpacked = train(main_forked, tiny, tmp_path / "unpacked", *run)
    train(main_forked, tiny, tmp_path / "packed", *run, BUDGET)
    packed = records_of(tmp_path / "packed")
    assert sorted(i for r in packed for i in r["sample_ids"]) == [0, 1, 2, 3]
    for ours, theirs in zip([r["loss"] for r in packed], unpacked, strict=True):
        assert abs(ours - theirs) <= 1e-5 * abs(theirs)


def test_two_sources_with_repeats_train_the_losses_of_one_file_listing_their_rows_so(
    tiny, clips_and_images, tmp_path, main_forked
):
    """``data.sources``: the clips twice, the images once, packed; the epoch is the 6 samples of one metadata
    file listing the clips, the clips again and the images: the same losses, each repeat with its own noise
    and timestep (its own place in the epoch)."""
    rows = json.loads(clips_and_images.read_text())
    clips, images = [r for r in rows if r["kind"] == "clip"], [r for r in rows if r["kind"] == "image"]
    folder = clips_and_images.parent
    for name, listed in (
        ("clips.json", clips),
        ("images.json", images),
        ("listed.json", clips + clips + images),
    ):
        (folder / name).write_text(json.dumps(listed))
    run = ["training.global_batch_size=2", "training.micro_batch_size=1", "training.train_iters=3",
           "training.log_sample_ids=true", BUDGET]  # fmt: skip
    sources = f"data.sources=[{{data_path: {folder / 'clips.json'}, repeats: 2}}, {{data_path: {folder / 'images.json'}}}]"
    listed = train(main_forked, tiny, tmp_path / "listed", *run, f"data.data_path={folder / 'listed.json'}")
    joined = train(main_forked, tiny, tmp_path / "joined", *run, "data.data_path=null", sources)
    assert sorted(i for r in records_of(tmp_path / "joined") for i in r["sample_ids"]) == list(range(6))
    assert joined == pytest.approx(listed, rel=1e-6)
