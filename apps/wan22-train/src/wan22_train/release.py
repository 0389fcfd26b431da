"""A Wan2.2 release folder as downloaded, official or ``-Diffusers``: where each sub-model's files are,
and the structure of the official files that carry no ``config.json``.

A sub-model's ``from_pretrained`` (or ``checkpoint_path``) may name its own files (a component folder,
a ``.pth``, a ComfyUI single file) or the release root; :func:`component_path` finds the component in a
root. The layouts (read from the public Wan2.2 code, ``wan/configs/*.py``, and the diffusers pipeline
folders, 2026-12):

============================  ===========================================  ====================
component                     official (``Wan-AI/Wan2.2-T2V-A14B`` ...)     ``-Diffusers``
============================  ===========================================  ====================
VAE                           ``Wan2.1_VAE.pth`` (A14B), ``Wan2.2_VAE.pth``  ``vae/``
                              (TI2V-5B)
UMT5 encoder                  ``models_t5_umt5-xxl-enc-bf16.pth``          ``text_encoder/``
tokenizer                     ``google/umt5-xxl/``                         ``tokenizer/``
high-noise expert (A14B)      ``high_noise_model/``                        ``transformer/``
low-noise expert (A14B)       ``low_noise_model/``                         ``transformer_2/``
the DiT (TI2V-5B)             the root itself                              ``transformer/``
============================  ===========================================  ====================

The official ``.pth`` files hold weights only; their structure is the official code's: the Wan2.1 VAE
(``wan/modules/vae2_1.py``: base 96, z 16, ``dim_mult`` 1 2 4 4, 2 residual blocks, temporal
downsampling on the last two stages), the Wan2.2 VAE (``vae2_2.py``: base 160, decoder 256, z 48, 2x2
patchify, 16x spatial compression) with their latent statistics, and UMT5-XXL (``t5.py``:
``umt5_xxl``). :func:`vae_structure` and :data:`UMT5_XXL` give them, in diffusers' and transformers'
keyword names; a sub-model's ``config`` keys override them (a smaller test model).
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

Component = Literal["vae", "text_encoder", "tokenizer", "high_noise", "low_noise", "dit"]

OFFICIAL_NAMES: dict[str, tuple[str, ...]] = {
    "vae": ("Wan2.1_VAE.pth", "Wan2.2_VAE.pth"),
    "text_encoder": ("models_t5_umt5-xxl-enc-bf16.pth",),
    "tokenizer": ("google/umt5-xxl",),
    "high_noise": ("high_noise_model",),
    "low_noise": ("low_noise_model",),
}
"""Files and folders of an official release root, by component."""
DIFFUSERS_NAMES: dict[str, tuple[str, ...]] = {
    "vae": ("vae",),
    "text_encoder": ("text_encoder",),
    "tokenizer": ("tokenizer",),
    "high_noise": ("transformer",),
    "low_noise": ("transformer_2",),
    "dit": ("transformer",),
}
"""Folders of a ``-Diffusers`` pipeline root, by component."""
EXPERT_COMPONENTS: dict[str, Component] = {"high_noise": "high_noise", "low_noise": "low_noise"}

WAN21_LATENTS_MEAN = [
    -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
    0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921,
]  # fmt: skip
WAN21_LATENTS_STD = [
    2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
    3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160,
]  # fmt: skip
WAN22_LATENTS_MEAN = [
    -0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557, -0.1382, 0.0542, 0.2813, 0.0891,
    0.1570, -0.0098, 0.0375, -0.1825, -0.2246, -0.1207, -0.0698, 0.5109, 0.2665, -0.2108, -0.2158, 0.2502,
    -0.2055, -0.0322, 0.1109, 0.1567, -0.0729, 0.0899, -0.2799, -0.1230, -0.0313, -0.1649, 0.0117, 0.0723,
    -0.2839, -0.2083, -0.0520, 0.3748, 0.0152, 0.1957, 0.1433, -0.2944, 0.3573, -0.0548, -0.1681, -0.0667,
]  # fmt: skip
WAN22_LATENTS_STD = [
    0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013, 0.8158, 1.0344, 0.5894, 1.0901,
    0.6885, 0.6165, 0.8454, 0.4978, 0.5759, 0.3523, 0.7135, 0.6804, 0.5833, 1.4146, 0.8986, 0.5659,
    0.7069, 0.5338, 0.4889, 0.4917, 0.4069, 0.4999, 0.6866, 0.4093, 0.5709, 0.6065, 0.6415, 0.4944,
    0.5726, 1.2042, 0.5458, 1.6887, 0.3971, 1.0600, 0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744,
]  # fmt: skip
WAN21_VAE: dict[str, Any] = {
    "base_dim": 96, "z_dim": 16, "dim_mult": [1, 2, 4, 4], "num_res_blocks": 2, "attn_scales": [],
    "temperal_downsample": [False, True, True], "latents_mean": WAN21_LATENTS_MEAN,
    "latents_std": WAN21_LATENTS_STD, "scale_factor_temporal": 4, "scale_factor_spatial": 8,
}  # fmt: skip
"""``AutoencoderKLWan`` keywords of the official ``Wan2.1_VAE.pth``."""
WAN22_VAE: dict[str, Any] = {
    "base_dim": 160, "decoder_base_dim": 256, "z_dim": 48, "dim_mult": [1, 2, 4, 4], "num_res_blocks": 2,
    "attn_scales": [], "temperal_downsample": [False, True, True], "is_residual": True, "in_channels": 12,
    "out_channels": 12, "patch_size": 2, "latents_mean": WAN22_LATENTS_MEAN, "latents_std": WAN22_LATENTS_STD,
    "scale_factor_temporal": 4, "scale_factor_spatial": 16,
}  # fmt: skip
"""``AutoencoderKLWan`` keywords of the official ``Wan2.2_VAE.pth``."""
UMT5_XXL: dict[str, Any] = {
    "vocab_size": 256384, "d_model": 4096, "d_kv": 64, "d_ff": 10240, "num_layers": 24, "num_heads": 64,
    "relative_attention_num_buckets": 32, "relative_attention_max_distance": 128, "feed_forward_proj": "gated-gelu",
    "layer_norm_epsilon": 1e-6,
}  # fmt: skip
"""``UMT5Config`` keywords of the official ``models_t5_umt5-xxl-enc-bf16.pth`` (``t5.py``'s ``umt5_xxl``:
the official GELU is the tanh approximation, transformers' ``gelu_new`` of ``gated-gelu``)."""


def is_release_root(path: str | os.PathLike) -> bool:
    """True for a folder holding a whole release: a diffusers pipeline root (``model_index.json``) or an
    official one (any of :data:`OFFICIAL_NAMES`)."""
    p = Path(path)
    if not p.is_dir():
        return False
    if (p / "model_index.json").is_file():
        return True
    return any((p / name).exists() for names in OFFICIAL_NAMES.values() for name in names)


def component_path(source: str | os.PathLike | None, component: Component) -> Path | None:
    """Where ``component``'s files are: ``source`` itself when it names them, else found in the release
    root ``source`` (table in the module docstring). None when ``source`` is None.

    Raises:
        FileNotFoundError: the root holds none of the component's names, or (``dit``) two experts,
            or (``vae``) both VAEs; each names what it found.
    """
    if source is None:
        return None
    root = Path(source)
    if not is_release_root(root):
        return root
    if component == "dit":
        return _dit_in(root)
    names = [*OFFICIAL_NAMES.get(component, ()), *DIFFUSERS_NAMES.get(component, ())]
    found = [root / n for n in names if (root / n).exists()]
    if len(found) == 1:
        return found[0]
    what = {"vae": "the VAE", "text_encoder": "the UMT5 encoder", "tokenizer": "the tokenizer"}.get(
        component, f"the {component.replace('_', '-')} expert"
    )
    if not found:
        raise FileNotFoundError(
            f"{root} is a Wan2.2 release folder without {what}: expected one of {names}; "
            f"it holds {sorted(p.name for p in root.iterdir())}"
        )
    raise FileNotFoundError(
        f"{root} holds several candidates for {what}: {[p.name for p in found]}; name the one to use"
    )


def _dit_in(root: Path) -> Path:
    """The DiT of a one-model release (TI2V-5B): the official root itself or the diffusers ``transformer/``."""
    experts = [*OFFICIAL_NAMES["high_noise"], *OFFICIAL_NAMES["low_noise"], *DIFFUSERS_NAMES["low_noise"]]
    present = [n for n in experts if (root / n).exists()]
    if present:
        raise FileNotFoundError(
            f"{root} holds the two A14B experts ({present}): set the predictor's config.expert "
            "(high_noise or low_noise) to say which one this predictor is"
        )
    if (root / "config.json").is_file():
        return root
    if (root / "transformer").is_dir():
        return root / "transformer"
    raise FileNotFoundError(f"{root} is a Wan2.2 release folder without a DiT (config.json or transformer/)")


def vae_structure(keys: list[str]) -> dict[str, Any]:
    """The official ``AutoencoderKLWan`` keywords of a VAE whose weight names are ``keys``: Wan2.2's
    when its stages are nested (``encoder.downsamples.0.downsamples.*``, or diffusers' ``resnets``),
    else Wan2.1's."""
    nested = any(
        k.startswith(("encoder.downsamples.0.downsamples.", "encoder.down_blocks.0.resnets.")) for k in keys
    )
    return dict(WAN22_VAE if nested else WAN21_VAE)


def vae_keywords(config: dict[str, Any] | None) -> dict[str, Any]:
    """``AutoencoderKLWan`` keywords of a VAE built from sub-model ``config`` keys alone (no download yet,
    e.g. for a plan): a 48-channel VAE (``z_dim: 48``) whose keys name no ``latents_mean`` /
    ``latents_std`` takes the Wan2.2 release's statistics (diffusers' defaults are Wan2.1's 16).

    Raises:
        ValueError: ``latents_mean`` or ``latents_std`` has a length other than ``z_dim``.
    """
    keywords = dict(config or {})
    z_dim = int(keywords.get("z_dim", WAN21_VAE["z_dim"]))
    if z_dim == WAN22_VAE["z_dim"]:
        keywords.setdefault("latents_mean", WAN22_LATENTS_MEAN)
        keywords.setdefault("latents_std", WAN22_LATENTS_STD)
    for key in ("latents_mean", "latents_std"):
        if key in keywords and len(keywords[key]) != z_dim:
            raise ValueError(f"the VAE's config.{key} has {len(keywords[key])} values; z_dim is {z_dim}")
    return keywords


def source_of(args: Any) -> str | None:
    """The weights a sub-model section names: ``checkpoint_path`` over ``from_pretrained``."""
    source = getattr(args, "checkpoint_path", None) or getattr(args, "from_pretrained", None)
    return str(source) if source else None


def resolved_args(args: Any, component: Component) -> Any:
    """``args`` with its weights source (``checkpoint_path`` or ``from_pretrained``) pointing at
    ``component``'s files in a release root (:func:`component_path`); ``args`` itself otherwise."""
    source = source_of(args)
    path = component_path(source, component)
    if path is None or str(path) == source:
        return args
    key = "checkpoint_path" if getattr(args, "checkpoint_path", None) else "from_pretrained"
    if hasattr(args, "model_copy"):
        return args.model_copy(update={key: str(path)})
    return SimpleNamespace(**{**vars(args), key: str(path)})
