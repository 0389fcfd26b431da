"""The README's tiny session, as a user types it from the repository root (each line taken from the README
by its text): make-tiny, a 2-rank training with an EMA, the three exports, plot and sample. Shortened as
the README says: the training to 2 steps, make-tiny without the VAE fit."""

from __future__ import annotations

import json

import pytest
import torch
from mm_checkpoint.dcp_io import DcpReader
from safetensors.torch import load_file
from wan22_train.cli import main as wan22_main
from wan22_train.configs import config_path
from wan22_train.key_maps import diffusers_to_native

pytestmark = pytest.mark.slow

WAN_README = "apps/wan22-train/README.md"
CONFIGS = config_path("tiny_t2v.yaml").parent
MAKE_TINY = "wan22-train make-tiny runs/tiny"
TRAIN = "torchrun --nproc-per-node 2 -m wan22_train --config apps/wan22-train/configs/tiny_t2v.yaml training.ema.decay=0.99"
EXPORT = "wan22-train export --checkpoint runs/tiny/ckpt --out runs/tiny/export/transformer"
EXPORT_EMA = "wan22-train export --checkpoint runs/tiny/ckpt --ema --out runs/tiny/export/ema"
EXPORT_NATIVE = (
    "wan22-train export --checkpoint runs/tiny/ckpt --layout native --out runs/tiny/export/high_noise_model"
)
PLOT = "wan22-train plot runs/tiny/ckpt"
SAMPLE = 'wan22-train sample --checkpoint runs/tiny/ckpt --prompt "a green circle moving left" --out runs/tiny/clip.mp4'


@pytest.fixture(scope="module")
def session(tmp_path_factory, main_forked, readme):
    """The working directory of the session after make-tiny and the training (2 steps at world size 2)."""
    cwd = tmp_path_factory.mktemp("wan_cli")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(cwd)
        assert wan22_main(readme.command(WAN_README, MAKE_TINY, extra=("--vae-fit-steps", "0"))[1:]) == 0
        argv = readme.command(
            WAN_README, TRAIN, paths={"apps/wan22-train/configs": CONFIGS}, extra=("training.train_iters=2",)
        )
        module, nproc, args = readme.launched(argv)
        assert (module, nproc) == ("wan22_train", 2)
        main_forked(wan22_main, args, nproc=nproc)
    return cwd


@pytest.fixture
def run(session, monkeypatch):
    """The session's ``runs/tiny``, with the session's directory as the working directory."""
    monkeypatch.chdir(session)
    return session / "runs" / "tiny"


def test_sample_and_export_read_the_run_saved_at_world_size_2(run, readme):
    # In this process (a fresh interpreter per command cost ~10 s; `python -m wan22_train` runs in
    # test_wan_demo_e2e.py): the commands' code path is the same.
    assert json.loads((run / "ckpt" / "iter_0000002" / "mm_checkpoint.json").read_text())["world_size"] == 2
    for line in (SAMPLE, EXPORT):
        assert wan22_main(readme.command(WAN_README, line)[1:]) == 0
    assert (run / "clip.mp4").stat().st_size > 0 and (
        run / "export" / "transformer" / "config.json"
    ).is_file()
    assert wan22_main(readme.command(WAN_README, PLOT)[1:]) == 0
    assert (run / "ckpt" / "metrics.png").stat().st_size > 0


def test_export_with_ema_writes_the_runs_average_instead_of_its_last_weights(run, readme):
    assert wan22_main(readme.command(WAN_README, EXPORT_EMA)[1:]) == 0
    assert wan22_main(readme.command(WAN_README, EXPORT, paths={"runs/tiny/export": run / "last"})[1:]) == 0
    averaged, last = (
        diffusers_to_native(load_file(folder / "diffusion_pytorch_model.safetensors"))
        for folder in (run / "export" / "ema", run / "last" / "transformer")
    )
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
def test_native_export_has_the_official_names_and_the_trained_weights(run, tmp_path, shard, readme):
    out = tmp_path / "high_noise_model"
    extra = ("--max-shard-size", shard) if shard else ()
    argv = readme.command(
        WAN_README, EXPORT_NATIVE, paths={"runs/tiny/export/high_noise_model": out}, extra=extra
    )
    assert wan22_main(argv[1:]) == 0
    files = sorted(
        p.name for p in out.iterdir() if not p.name.startswith(".")
    )  # + the hidden .mm_export.json
    weights = [f for f in files if f.endswith(".safetensors")]
    if shard is None:
        assert files == ["config.json", "diffusion_pytorch_model.safetensors"]
    else:
        n = len(weights)
        assert n > 1 and weights == [
            f"diffusion_pytorch_model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)
        ]
        assert "diffusion_pytorch_model.safetensors.index.json" in files
    config = json.loads((out / "config.json").read_text())
    assert config["_class_name"] == "WanModel" and "_diffusers_version" in config
    assert set(config) - {"_class_name", "_diffusers_version"} == OFFICIAL_CONFIG_KEYS | {
        "text_dim"
    }  # tiny: 32
    state = _read_as_the_official_code_does(out)
    saved = DcpReader(run / "ckpt" / "iter_0000002")
    trained = {k.removeprefix("predictor."): k for k in saved.keys() if k.startswith("predictor.")}
    assert (
        state.keys() == trained.keys()
        and "blocks.0.self_attn.q.weight" in state
        and "head.modulation" in state
    )
    for key, value in state.items():
        assert torch.equal(value, saved.read(trained[key])), key
