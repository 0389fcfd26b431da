"""`wan22-train sample` and `export` on a finished run, as a user types them (single process).

The run they read trains on 2 forked gloo ranks (``main_forked``), with ``training.ema``; the demo tests
cover the torchrun launch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from mm_checkpoint.dcp_io import DcpReader
from safetensors.torch import load_file
from wan22_train.cli import main as wan22_main
from wan22_train.configs import config_path
from wan22_train.tiny import make_tiny, tiny_overrides

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run(tmp_path_factory, main_forked):
    """A tiny Wan2.2 set trained 2 steps at world size 2 with an EMA (decay 0.5); its folder."""
    out = make_tiny(tmp_path_factory.mktemp("wan_cli") / "tiny")
    train = ["--config", str(config_path("tiny_t2v.yaml")), *tiny_overrides(out), f"training.save={out / 'ckpt'}",
             "training.train_iters=2", "training.ema.decay=0.5"]  # fmt: skip
    main_forked(wan22_main, train, nproc=2)
    return out


def test_sample_and_export_read_the_run_saved_at_world_size_2(run, tmp_path):
    python = [sys.executable, "-m", "wan22_train"]
    assert json.loads((run / "ckpt" / "iter_0000002" / "mm_checkpoint.json").read_text())["world_size"] == 2
    clip, folder = tmp_path / "clip.mp4", tmp_path / "transformer"
    for cmd in (
        [
            "sample",
            "--checkpoint",
            str(run / "ckpt"),
            "--prompt",
            "a red square moving left",
            "--out",
            str(clip),
        ],
        ["export", "--checkpoint", str(run / "ckpt"), "--out", str(folder)],
    ):
        proc = subprocess.run([*python, *cmd], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert clip.stat().st_size > 0 and (folder / "config.json").is_file()


def test_export_with_ema_writes_the_runs_average_instead_of_its_last_weights(run, tmp_path):
    export = ["export", "--checkpoint", str(run / "ckpt"), "--layout", "native"]
    assert wan22_main([*export, "--ema", "--out", str(tmp_path / "ema")]) == 0
    assert wan22_main([*export, "--out", str(tmp_path / "last")]) == 0
    averaged, last = (load_file(tmp_path / name / "diffusion_pytorch_model.safetensors") for name in ("ema", "last"))
    saved = DcpReader(run / "ckpt" / "iter_0000002", ema=True)
    assert averaged.keys() == last.keys()
    for key, value in averaged.items():
        assert torch.equal(value, saved.read(f"predictor.{key}")), key
    assert any(not torch.equal(value, last[key]) for key, value in averaged.items())  # it lags the weights


#: The keys the official ``WanModel`` stores in its config.json (its ``__init__`` parameters less
#: ``ignore_for_config``: patch_size, cross_attn_norm, qk_norm, text_dim, window_size), from
#: ``wan/modules/model.py`` of Wan-Video/Wan2.2.
OFFICIAL_CONFIG_KEYS = {"model_type", "text_len", "in_dim", "dim", "ffn_dim", "freq_dim", "out_dim", "num_heads",
                        "num_layers", "eps"}  # fmt: skip


def _read_as_the_official_code_does(folder) -> dict[str, torch.Tensor]:
    """``WanModel.from_pretrained(folder)``'s weight files (a diffusers ``ModelMixin``): the index's shards,
    or the one ``diffusion_pytorch_model.safetensors``."""
    index = folder / "diffusion_pytorch_model.safetensors.index.json"
    if not index.is_file():
        return load_file(folder / "diffusion_pytorch_model.safetensors")
    weight_map = json.loads(index.read_text())["weight_map"]
    state = {}
    for shard in sorted(set(weight_map.values())):
        part = load_file(folder / shard)
        assert {k for k, s in weight_map.items() if s == shard} == part.keys(), shard
        state |= part
    return state


@pytest.mark.parametrize("shard", [None, "20KB"])
def test_native_export_has_the_official_names_and_the_trained_weights(run, tmp_path, shard):
    out = tmp_path / "high_noise_model"
    args = ["export", "--checkpoint", str(run / "ckpt"), "--layout", "native", "--out", str(out)]
    assert wan22_main([*args, *(["--max-shard-size", shard] if shard else [])]) == 0
    files = sorted(p.name for p in out.iterdir())
    weights = [f for f in files if f.endswith(".safetensors")]
    if shard is None:
        assert files == ["config.json", "diffusion_pytorch_model.safetensors"]
    else:
        n = len(weights)
        assert n > 1 and weights == [f"diffusion_pytorch_model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
        assert "diffusion_pytorch_model.safetensors.index.json" in files
    config = json.loads((out / "config.json").read_text())
    assert config["_class_name"] == "WanModel" and "_diffusers_version" in config
    assert set(config) - {"_class_name", "_diffusers_version"} == OFFICIAL_CONFIG_KEYS | {"text_dim"}  # tiny: 32
    state = _read_as_the_official_code_does(out)
    saved = DcpReader(run / "ckpt" / "iter_0000002")
    trained = {k.removeprefix("predictor."): k for k in saved.keys() if k.startswith("predictor.")}
    assert state.keys() == trained.keys() and "blocks.0.self_attn.q.weight" in state and "head.modulation" in state
    for key, value in state.items():
        assert torch.equal(value, saved.read(trained[key])), key
