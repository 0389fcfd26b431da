"""The official LTX-2 release file: transformer, video VAE, audio VAE, vocoder and text connectors in one
``.safetensors``, as Lightricks publish ``ltx-2-19b-dev.safetensors``; written from a diffusers model set and
read back by ``preprocess`` (the VAEs and connectors) and training (the transformer).

Key layout (facts of diffusers' converters: ``diffusers.loaders.single_file_utils`` 0.42.1 and its
``scripts/convert_ltx2_to_diffusers.py``, which read these files):

- ``model.diffusion_model.<official transformer name>`` (:mod:`ltx2_train.official`);
- ``model.diffusion_model.video_embeddings_connector.*`` / ``audio_embeddings_connector.*`` (diffusers'
  ``video_connector`` / ``audio_connector``, ``transformer_1d_blocks``, ``q_norm`` / ``k_norm``) and the
  top-level ``text_embedding_projection.aggregate_embed`` (diffusers' ``text_proj_in``): LTX-2.0's connectors;
- ``vae.*``: the video VAE in the official block numbering, each level's resnets and its downsampler /
  upsampler being blocks of their own (encoder ``down_blocks.{2i}`` / ``{2i+1}``, mid block
  ``down_blocks.8``; decoder ``up_blocks.0`` = mid block, ``{2i+1}`` / ``{2i+2}``), ``res_blocks``, and
  ``per_channel_statistics.mean-of-means`` / ``std-of-means`` (diffusers' ``latents_mean`` / ``latents_std``).
  That numbering is the released VAE's (4 encoder levels, 3 decoder levels), which diffusers' converter
  hard-codes; a VAE with more levels is refused;
- ``audio_vae.*`` (the statistics renamed as the video VAE's) and ``vocoder.*`` (``ups``, ``resblocks``,
  ``conv_pre``, ``conv_post``).

Metadata: ``config`` with the ``transformer`` section (:func:`ltx2_train.official.single_file_metadata`).
The VAEs', vocoder's and connectors' sections are not written (their official field names are not
established here): a reader takes those components' shapes from a diffusers folder's ``config.json``
files, as diffusers' ``from_single_file(file, config=...)`` does.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from diffusers import AutoencoderKLLTX2Audio, AutoencoderKLLTX2Video
from diffusers.loaders.single_file_utils import convert_ltx2_audio_vae_to_diffusers
from diffusers.pipelines.ltx2.connectors import LTX2TextConnectors
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from ltx2_train.official import OFFICIAL_PREFIX, single_file_metadata

VAE_PREFIX, AUDIO_VAE_PREFIX, VOCODER_PREFIX = "vae.", "audio_vae.", "vocoder."
TEXT_PROJECTION = "text_embedding_projection.aggregate_embed."
"""The connectors' input projection, at the top level of the file (diffusers' ``text_proj_in``)."""
CONNECTOR_STREAMS = {
    "video_connector.": "video_embeddings_connector.",
    "audio_connector.": "audio_embeddings_connector.",
}
#: The released video VAE's levels, which the official block numbering (and diffusers' converter) assumes.
VAE_LEVELS = {"encoder": 4, "decoder": 3}
_STATISTICS = {"latents_mean": "per_channel_statistics.mean-of-means", "latents_std": "per_channel_statistics.std-of-means"}  # fmt: skip
_VOCODER = {
    "upsamplers.": "ups.",
    "resnets.": "resblocks.",
    "conv_in.": "conv_pre.",
    "conv_out.": "conv_post.",
}
_CONNECTOR_PARTS = {
    ".transformer_blocks.": ".transformer_1d_blocks.",
    ".norm_q.": ".q_norm.",
    ".norm_k.": ".k_norm.",
}


def official_vae_key(key: str) -> str:
    """The official name of diffusers ``AutoencoderKLLTX2Video`` key ``key`` (module docstring)."""
    if key in _STATISTICS:
        return _STATISTICS[key]
    level = re.match(r"^(encoder\.down_blocks|decoder\.up_blocks)\.(\d+)(\.(?:down|up)samplers\.0)?\.", key)
    if level:
        side, i, sampler = level.group(1).split(".")[0], int(level.group(2)), level.group(3) is not None
        if i >= VAE_LEVELS[side]:
            raise ValueError(
                f"video VAE key {key!r}: the official layout numbers {VAE_LEVELS[side]} {side} levels (the "
                "released VAE's, which diffusers' converter assumes); this VAE has more"
            )
        # encoder: level i's resnets, then its downsampler; decoder: block 0 is the mid block, then level
        # i's upsampler, then its resnets
        index = 2 * i + (int(sampler) if side == "encoder" else 2 - int(sampler))
        key = f"{level.group(1)}.{index}.{key[level.end() :]}"
    key = key.replace("encoder.mid_block.", "encoder.down_blocks.8.").replace(
        "decoder.mid_block.", "decoder.up_blocks.0."
    )
    return key.replace(".resnets.", ".res_blocks.")


def official_audio_vae_key(key: str) -> str:
    """The official name of diffusers ``AutoencoderKLLTX2Audio`` key ``key``."""
    return _STATISTICS.get(key, key)


def official_vocoder_key(key: str) -> str:
    """The official name of diffusers ``LTX2Vocoder`` key ``key``."""
    for new, old in _VOCODER.items():
        if key.startswith(new):
            return old + key.removeprefix(new)
    return key


def official_connector_key(key: str) -> str:
    """The full official key (prefix included) of diffusers ``LTX2TextConnectors`` key ``key`` (LTX-2.0's)."""
    if key.startswith("text_proj_in."):
        return TEXT_PROJECTION + key.removeprefix("text_proj_in.")
    for stream, official in CONNECTOR_STREAMS.items():
        if key.startswith(stream):
            key = "." + key.removeprefix(stream)
            for new, old in _CONNECTOR_PARTS.items():
                key = key.replace(new, old)
            return OFFICIAL_PREFIX + official + key[1:]
    raise ValueError(
        f"text connector key {key!r}: the official layout of LTX-2.0's connectors has text_proj_in, "
        "video_connector and audio_connector only (LTX-2.3's per-modality projections are not written here)"
    )


def diffusers_connectors_state(path: str | Path) -> dict[str, torch.Tensor]:
    """The text connectors of release file ``path`` under diffusers ``LTX2TextConnectors`` keys (the inverse
    of :func:`official_connector_key`, the renames of diffusers' conversion script)."""
    out = {}
    with safe_open(str(path), framework="pt") as f:
        for key in f.keys():
            if key.startswith(TEXT_PROJECTION):
                out["text_proj_in." + key.removeprefix(TEXT_PROJECTION)] = f.get_tensor(key)
                continue
            for stream, official in CONNECTOR_STREAMS.items():
                if key.startswith(OFFICIAL_PREFIX + official):
                    rest = "." + key.removeprefix(OFFICIAL_PREFIX + official)
                    for new, old in _CONNECTOR_PARTS.items():
                        rest = rest.replace(old, new)
                    out[stream + rest[1:]] = f.get_tensor(key)
    return out


def component_state(path: str | Path, prefix: str) -> dict[str, torch.Tensor]:
    """The tensors of release file ``path`` under ``prefix`` (prefix kept: what diffusers' converters take)."""
    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys() if k.startswith(prefix)}


def write_release_file(root: str | Path, out: str | Path, *, vocoder: torch.nn.Module | None = None) -> Path:
    """Write the diffusers LTX-2 model set ``root`` (``transformer/``, ``vae/``, ``audio_vae/``,
    ``connectors/``, and ``vocoder/`` or ``vocoder``) as one official release file ``out`` (module docstring),
    with the transformer's official ``config`` metadata."""
    import json

    from mm_checkpoint import get_weight_transform

    from ltx2_train.export import OFFICIAL_KEY_MAP
    from ltx2_train.predictor import INIT_KEYS, TRANSFORMER_DEFAULTS

    root = Path(root)
    names = get_weight_transform(OFFICIAL_KEY_MAP)
    state: dict[str, torch.Tensor] = {}

    def add(
        folder: str, rename: Callable[[str], str], prefix: str = "", weights: Mapping[str, Any] | None = None
    ):
        tensors = weights if weights is not None else _folder_weights(root / folder)
        for key, value in tensors.items():
            state[prefix + rename(key)] = value.detach().contiguous()

    add("transformer", lambda k: next(iter(names.plan_export([k]))), OFFICIAL_PREFIX)
    add("connectors", official_connector_key)
    add("vae", official_vae_key, VAE_PREFIX)
    add("audio_vae", official_audio_vae_key, AUDIO_VAE_PREFIX)
    vocoder_weights = vocoder.state_dict() if vocoder is not None else None
    if vocoder_weights is not None or (root / "vocoder").is_dir():
        add("vocoder", official_vocoder_key, VOCODER_PREFIX, vocoder_weights)
    config = json.loads((root / "transformer" / "config.json").read_text())
    shape = TRANSFORMER_DEFAULTS | {k: v for k, v in config.items() if k in INIT_KEYS}
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file(state, out, metadata=single_file_metadata(shape))
    return out


def _folder_weights(folder: Path) -> dict[str, torch.Tensor]:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder}: no .safetensors weights to write into the release file")
    return {k: v for f in files for k, v in load_file(f).items()}


def load_release_encoders(
    path: str | Path, root: str | Path, *, audio: bool, dtype: torch.dtype
) -> tuple[AutoencoderKLLTX2Video, AutoencoderKLLTX2Audio | None, LTX2TextConnectors]:
    """The video VAE, audio VAE (``audio``) and text connectors of release file ``path``: weights from the
    file, each component's ``config.json`` from the diffusers folder ``root`` (``vae/``, ``audio_vae/``,
    ``connectors/``). The VAEs load through diffusers' own converters (the video VAE's ``from_single_file``;
    the audio VAE's ``convert_ltx2_audio_vae_to_diffusers``, the class having no ``from_single_file``)."""
    root = Path(root)
    vae = AutoencoderKLLTX2Video.from_single_file(
        component_state(path, VAE_PREFIX), config=str(root), subfolder="vae", torch_dtype=dtype,
        local_files_only=True,
    )  # fmt: skip
    audio_vae = None
    if audio:  # diffusers 0.42.1's AutoencoderKLLTX2Audio has no from_single_file: its converter, then the folder's config
        audio_vae = AutoencoderKLLTX2Audio.from_config(AutoencoderKLLTX2Audio.load_config(root / "audio_vae"))
        audio_vae.load_state_dict(
            convert_ltx2_audio_vae_to_diffusers(component_state(path, AUDIO_VAE_PREFIX))
        )
        audio_vae = audio_vae.to(dtype)
    connectors = LTX2TextConnectors.from_config(LTX2TextConnectors.load_config(root / "connectors"))
    connectors.load_state_dict(diffusers_connectors_state(path), strict=True)
    return vae, audio_vae, connectors.to(dtype)
