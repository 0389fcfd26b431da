"""The official LTX-2 single-file layout of the transformer: the names and the metadata of Lightricks'
``.safetensors`` releases, as the official code (``ltx-core``) and diffusers' ``from_single_file`` read them.

- Keys: ``model.diffusion_model.`` + the official module names (mm-checkpoint's ``ltx2`` key map, checked
  against diffusers' ``convert_ltx2_transformer_to_diffusers``). A release file also holds the video VAE
  (``vae.``), audio VAE (``audio_vae.``), vocoder (``vocoder.``) and text connectors; an export of this
  app holds the transformer alone.
- Metadata: ``config``, a JSON object whose ``transformer`` section ltx-core's ``LTXModelConfigurator``
  reads, under its own argument names. :data:`SAME_NAMES` and :func:`official_transformer_config` give
  the LTX-2.0 fields and the diffusers arguments they come from; diffusers' loader reads no metadata (it
  takes the model's ``config.json`` from ``config=``).

Diffusers arguments without an official field (patch sizes, ``vae_scale_factors``, the audio sampling rate
and hop length, ...) have no place in the metadata: a run reading such a file takes them from
``model.config`` (their defaults otherwise). The LTX-2.3 options (gated attention, cross-attention
modulation, prompt AdaLN) are refused in the metadata: their official field names are not established here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ltx2_train.version import SINGLE_FILE_OPTIONS

OFFICIAL_PREFIX = "model.diffusion_model."
"""The prefix of the transformer's keys in an official single file (ComfyUI's checkpoint prefix)."""
METADATA_CONFIG = "config"
"""The safetensors metadata entry holding the official config (JSON, sections ``transformer``, ``vae``, ...)."""

SAME_NAMES = (
    "num_attention_heads", "attention_head_dim", "in_channels", "out_channels", "num_layers",
    "cross_attention_dim", "norm_eps", "timestep_scale_multiplier", "audio_num_attention_heads",
    "audio_attention_head_dim", "audio_in_channels", "audio_out_channels", "audio_cross_attention_dim",
    "caption_channels", "rope_type", "activation_fn", "attention_bias", "norm_elementwise_affine",
)  # fmt: skip
"""Transformer fields named alike in diffusers' ``LTX2VideoTransformer3DModel`` and ltx-core's config."""
LTX23_OPTIONS = {
    "gated_attn": False, "audio_gated_attn": False, "cross_attn_mod": False, "audio_cross_attn_mod": False,
    "perturbed_attn": False, "use_prompt_embeddings": True, "use_keyframes_abs_pos_embedding": False,
}  # fmt: skip
"""Diffusers options beyond LTX-2.0, with their 2.0 values: a config with another value is refused here."""


def official_transformer_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The metadata's ``transformer`` section for diffusers constructor arguments ``config`` (complete: the
    source's ``config.json`` over the class defaults).

    Raises:
        ValueError: ``config`` uses an LTX-2.3 option (:data:`LTX23_OPTIONS`).
    """
    newer = {k: config[k] for k, v in LTX23_OPTIONS.items() if config.get(k, v) != v}
    if newer:
        raise ValueError(
            f"the official single-file metadata is written for LTX-2.0 transformers; this one sets {newer}"
        )
    if config["qk_norm"] != "rms_norm_across_heads":
        raise ValueError(
            f"qk_norm {config['qk_norm']!r}: the official transformer has rms_norm_across_heads only"
        )
    out = {name: config[name] for name in SAME_NAMES}
    out.update(
        positional_embedding_theta=config["rope_theta"],
        positional_embedding_max_pos=[
            config["pos_embed_max_pos"],
            config["base_height"],
            config["base_width"],
        ],
        audio_positional_embedding_max_pos=[config["audio_pos_embed_max_pos"]],
        av_ca_timestep_scale_multiplier=config["cross_attn_timestep_scale_multiplier"]
        / config["timestep_scale_multiplier"],
        frequencies_precision="float64" if config["rope_double_precision"] else "float32",
        qk_norm="rms_norm",  # diffusers' rms_norm_across_heads: RMS over all heads, ltx-core's only kind
    )
    return out


def diffusers_transformer_config(official: Mapping[str, Any]) -> dict[str, Any]:
    """Diffusers constructor arguments from the metadata's ``transformer`` section (inverse of
    :func:`official_transformer_config` on the fields it writes, plus the release options of
    :data:`ltx2_train.version.SINGLE_FILE_OPTIONS`; fields it does not know are left out)."""
    out = {name: official[name] for name in SAME_NAMES if name in official}
    for key, (name, negated) in SINGLE_FILE_OPTIONS.items():  # the release options (ltx2_train.version)
        if key in official:
            out[name] = not official[key] if negated else official[key]
    if "positional_embedding_theta" in official:
        out["rope_theta"] = official["positional_embedding_theta"]
    if "positional_embedding_max_pos" in official:
        out["pos_embed_max_pos"], out["base_height"], out["base_width"] = official[
            "positional_embedding_max_pos"
        ]
    if "audio_positional_embedding_max_pos" in official:
        (out["audio_pos_embed_max_pos"],) = official["audio_positional_embedding_max_pos"]
    if "av_ca_timestep_scale_multiplier" in official:
        scale = out.get("timestep_scale_multiplier", 1000)
        out["cross_attn_timestep_scale_multiplier"] = official["av_ca_timestep_scale_multiplier"] * scale
    if "frequencies_precision" in official:
        out["rope_double_precision"] = official["frequencies_precision"] == "float64"
    return out


def single_file_metadata(config: Mapping[str, Any]) -> dict[str, str]:
    """The safetensors metadata of an official-layout transformer file for diffusers arguments ``config``."""
    return {METADATA_CONFIG: json.dumps({"transformer": official_transformer_config(config)})}


def is_single_file(source: str | Path | None) -> bool:
    """True when ``source`` names a ``.safetensors`` file (an official-layout single file, not a folder)."""
    return source is not None and Path(source).suffix == ".safetensors" and Path(source).is_file()


BUNDLED = ("vae.", "audio_vae.", "vocoder.", "text_embedding_projection.")
"""Prefixes of the components a release file holds beside the transformer (diffusers' converters' names)."""
CONNECTORS = ("video_embeddings_connector.", "audio_embeddings_connector.")
"""The text connectors a release file holds under the transformer's prefix (diffusers' ``LTX2TextConnectors``)."""


def read_single_file_config(path: str | Path) -> dict[str, Any]:
    """Diffusers constructor arguments from the metadata of the single file ``path`` (empty when it has none).

    Raises:
        ValueError: the file bundles other components beside the transformer (a release file: this app
            reads the transformer alone), or the ``config`` entry is not JSON with a ``transformer``
            object; naming the file.
    """
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        metadata = f.metadata() or {}
        keys = list(f.keys())
    _refuse_bundle(path, keys)
    if METADATA_CONFIG not in metadata:
        return {}
    try:
        section = json.loads(metadata[METADATA_CONFIG]).get("transformer")
    except (ValueError, AttributeError):
        section = None
    if not isinstance(section, dict):
        raise ValueError(
            f"{path}: its metadata {METADATA_CONFIG!r} is not a JSON object with a 'transformer' section"
        )
    return diffusers_transformer_config(section)


def _refuse_bundle(path: str | Path, keys: list[str]) -> None:
    """Refuse a file holding more than the transformer, before any weight is read."""
    found = sorted({p for k in keys for p in BUNDLED if k.startswith(p)})
    found += sorted(
        {OFFICIAL_PREFIX + c for k in keys for c in CONNECTORS if k.startswith(OFFICIAL_PREFIX + c)}
    )
    if found:
        raise ValueError(
            f"{path} holds {', '.join(p + '*' for p in found)} beside the transformer (an official release "
            "file bundling the VAEs, vocoder and text connectors); ltx2-train reads a file of the transformer "
            "alone: save it as a diffusers folder (LTX2VideoTransformer3DModel.from_single_file(file, "
            "config=<LTX-2 diffusers folder>).save_pretrained(dir)) and point model.from_pretrained at dir"
        )
