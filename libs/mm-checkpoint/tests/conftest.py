"""Tiny real upstream models saved with ``save_pretrained`` (sharded) for the mm-checkpoint tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("filterwarnings", "ignore:torch.distributed is disabled:UserWarning")


SHARD = "20KB"  # small enough that every tiny model is saved in several shards


def tiny_wan_transformer() -> nn.Module:
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4,
        text_dim=16, freq_dim=16, ffn_dim=32, num_layers=2, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", rope_max_seq_len=32,
    )  # fmt: skip


def tiny_wan_vae() -> nn.Module:
    from diffusers import AutoencoderKLWan

    torch.manual_seed(0)
    return AutoencoderKLWan(
        base_dim=8, z_dim=4, dim_mult=[1, 2], num_res_blocks=1, temperal_downsample=[True],
        latents_mean=[0.0] * 4, latents_std=[1.0] * 4,
    )  # fmt: skip


def tiny_umt5() -> nn.Module:
    from transformers import UMT5Config, UMT5EncoderModel

    torch.manual_seed(0)
    cfg = UMT5Config(vocab_size=64, d_model=16, d_kv=8, d_ff=32, num_layers=2, num_heads=2,
                     relative_attention_num_buckets=8)  # fmt: skip
    return UMT5EncoderModel(cfg).eval()


def wan_inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {
        "hidden_states": torch.randn(1, 4, 2, 4, 4, generator=g),
        "timestep": torch.tensor([500]),
        "encoder_hidden_states": torch.randn(1, 3, 16, generator=g),
    }


def save_model(model: nn.Module, path: Path) -> Path:
    model.save_pretrained(path, max_shard_size=SHARD, safe_serialization=True)
    return path


def meta_copy(factory: Callable[[], nn.Module]) -> nn.Module:
    """The same architecture built on the meta device (no storage, no init)."""
    with torch.device("meta"):
        return factory()


def assert_same_state(a: nn.Module, b: nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert sa[key].dtype == sb[key].dtype, key
        assert torch.equal(sa[key], sb[key]), key


class Tiny:
    """Helpers shared by the tests (``--import-mode=importlib`` forbids importing conftest)."""

    wan = staticmethod(tiny_wan_transformer)
    vae = staticmethod(tiny_wan_vae)
    umt5 = staticmethod(tiny_umt5)
    wan_inputs = staticmethod(wan_inputs)
    save = staticmethod(save_model)
    meta = staticmethod(meta_copy)
    assert_same_state = staticmethod(assert_same_state)


@pytest.fixture(scope="session")
def tiny() -> type[Tiny]:
    return Tiny


@pytest.fixture(scope="session")
def wan_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_model(tiny_wan_transformer(), tmp_path_factory.mktemp("wan") / "transformer")


@pytest.fixture(scope="session")
def vae_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_model(tiny_wan_vae(), tmp_path_factory.mktemp("vae") / "vae")


@pytest.fixture(scope="session")
def umt5_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_model(tiny_umt5(), tmp_path_factory.mktemp("umt5") / "text_encoder")
