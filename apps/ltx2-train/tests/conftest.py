"""Shared tiny LTX-2 transformer config and inputs for the ltx2-train tests."""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from ltx2_train.tiny import TINY_TRANSFORMER, one_token_patch

VIDEO_FHW = (3, 4, 4)  # 48 video tokens at patch size 1; the tiny clips' latent grid
#: The transformer ``make-tiny`` writes (and the e2e runs train): one patch covers the latent grid.
ONE_TOKEN_TRANSFORMER = TINY_TRANSFORMER | one_token_patch()
AUDIO_LEN = 7  # odd: exercises the padded split under Ulysses 2
TEXT_LEN = 6


def perturbed(model: torch.nn.Module, seed: int = 0, scale: float = 0.1) -> torch.nn.Module:
    """Add noise to every parameter so no term is trivially zero or one."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen))
    return model


def transformer_inputs(
    batch: int = 2, seed: int = 1, per_token_timestep: bool = True, config: dict = TINY_TRANSFORMER
) -> dict:
    """Keyword inputs of ``LTX2VideoTransformer3DModel.forward`` for ``config`` (default ``TINY_TRANSFORMER``)
    on the latent grid ``VIDEO_FHW``; text embeddings as wide as the config's release takes them."""
    from ltx2_train.release_inputs import text_widths

    g = torch.Generator().manual_seed(seed)
    video_text, audio_text = text_widths(TINY_TRANSFORMER | config)
    f, h, w = VIDEO_FHW
    patch, patch_t = config.get("patch_size", 1), config.get("patch_size_t", 1)
    video_len = (f // patch_t) * (h // patch) * (w // patch)
    timestep = (
        torch.rand(batch, video_len, generator=g) * 1000
        if per_token_timestep
        else torch.tensor([700.0, 30.0])
    )
    mask = torch.ones(batch, TEXT_LEN, dtype=torch.long)
    mask[0, :2] = 0
    return dict(
        hidden_states=torch.randn(batch, video_len, config["in_channels"], generator=g),
        audio_hidden_states=torch.randn(batch, AUDIO_LEN, TINY_TRANSFORMER["audio_in_channels"], generator=g),
        encoder_hidden_states=torch.randn(batch, TEXT_LEN, video_text, generator=g),
        audio_encoder_hidden_states=torch.randn(batch, TEXT_LEN, audio_text, generator=g),
        timestep=timestep,
        audio_timestep=torch.tensor([700.0, 30.0][:batch]),
        encoder_attention_mask=mask,
        audio_encoder_attention_mask=mask,
        num_frames=f, height=h, width=w, fps=8.0, audio_num_frames=AUDIO_LEN,
    )  # fmt: skip


@pytest.fixture(scope="session")
def tiny_predictor():
    """Factory ``(seed=0, release="2.0") -> LTX2Predictor`` with ``TINY_TRANSFORMER`` and the LTX-2 release's
    options (``ltx2_train.tiny.RELEASE_OPTIONS``), perturbed weights."""
    from types import SimpleNamespace

    from ltx2_train.predictor import LTX2Predictor
    from ltx2_train.tiny import RELEASE_OPTIONS

    def make(seed: int = 0, release: str = "2.0") -> torch.nn.Module:
        torch.manual_seed(seed)
        model = LTX2Predictor.build_from_config(
            SimpleNamespace(config=TINY_TRANSFORMER | RELEASE_OPTIONS[release], from_pretrained=None)
        )
        return perturbed(model, seed)

    return make


@pytest.fixture(scope="session")
def ltx2_inputs():
    """``transformer_inputs`` as a fixture."""
    return transformer_inputs


@pytest.fixture
def one_token_inputs():
    """``transformer_inputs`` for ``ONE_TOKEN_TRANSFORMER`` (the model set of ``tiny_cache``)."""
    return lambda **kw: transformer_inputs(config=ONE_TOKEN_TRANSFORMER, **kw)


REPO = Path(__file__).resolve().parents[3]
TINY_CONFIG = REPO / "apps" / "ltx2-train" / "configs" / "tiny_t2av.yaml"
TINY_DISTILL_CONFIG = TINY_CONFIG.with_name("tiny_t2av_distill.yaml")
TINY_LORA_CONFIG = TINY_CONFIG.with_name("tiny_t2av_lora.yaml")


def tiny_run_config(root: Path, config: Path = TINY_CONFIG, **training: object) -> Path:
    """``config`` (default ``configs/tiny_t2av.yaml``) with its ``runs/ltx2_tiny`` paths moved under
    ``root`` and ``training`` keys set; written to root."""
    text = config.read_text().replace("runs/ltx2_tiny", str(root))
    cfg = yaml.safe_load(text)
    cfg["training"].update(training)
    path = root / f"config_{len(list(root.glob('config_*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


@pytest.fixture(scope="session")
def lora_config() -> Path:
    """``configs/tiny_t2av_lora.yaml``: a ``config`` for :func:`tiny_run_config`."""
    return TINY_LORA_CONFIG


@pytest.fixture(scope="session")
def distill_config() -> Path:
    """``configs/tiny_t2av_distill.yaml``: a ``config`` for :func:`tiny_run_config`."""
    return TINY_DISTILL_CONFIG


@pytest.fixture(scope="module")
def ltx2_train(main_forked):
    """``ltx2_train(*args, nproc=1)``: ``ltx2-train``'s ``main`` on ``nproc`` forked gloo ranks."""
    from ltx2_train.cli import main

    return lambda *args, nproc=1: main_forked(main, args, nproc)


@pytest.fixture(scope="session")
def run_config():
    """``tiny_run_config`` as a fixture (session-scoped, so that module-scoped runs can use it)."""
    return tiny_run_config


def tiny_model_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``make-tiny``'s model set and clips (the VAE fitted: ~40 s), built once per test run. Under
    pytest-xdist the workers share one folder of this run (``PYTEST_XDIST_TESTRUNUID``): the first
    builds it under a file lock, the others wait and reuse it (``make_tiny`` completes, never
    rebuilds, a complete set)."""
    from ltx2_train.tiny import make_tiny

    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None:
        return make_tiny(tmp_path_factory.mktemp("ltx2_model_set"))
    shared = tmp_path_factory.getbasetemp().parent / f"ltx2_model_set_{run}"
    with open(f"{shared}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        return make_tiny(shared)


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory) -> Path:
    """A copy of :func:`tiny_model_set` + ``preprocess`` (one process) in a fresh folder of this worker's."""
    from ltx2_train.preprocess import run_preprocess
    from mm_config import load_config

    root = tmp_path_factory.mktemp("ltx2_tiny")
    shutil.copytree(tiny_model_set(tmp_path_factory), root, dirs_exist_ok=True)
    config = load_config(tiny_run_config(root), ["parallel.ulysses_parallel_size=1"], world_size=1)
    assert run_preprocess(config).computed == [0, 1, 2, 3]
    return root
