"""The official LTX-2 single-file layout of the transformer: the names and the metadata of Lightricks'
``.safetensors`` releases, as the official code (``ltx-core``) and diffusers' ``from_single_file`` read them.

- Keys: ``model.diffusion_model.`` + the official module names (mm-checkpoint's ``ltx2`` key map, checked
  against diffusers' ``convert_ltx2_transformer_to_diffusers``). A release file also holds the video VAE
  (``vae.``), audio VAE (``audio_vae.``), vocoder (``vocoder.``) and text connectors
  (:mod:`ltx2_train.release_file` writes and reads those); ``export --layout native`` writes the transformer
  alone.
- Metadata: ``config``, a JSON object whose ``transformer`` section ltx-core's ``LTXModelConfigurator``
  reads, under its own argument names. :data:`SAME_NAMES` and :func:`official_transformer_config` give
  the LTX-2.0 fields and the diffusers arguments they come from; diffusers' loader reads no metadata (it
  takes the model's ``config.json`` from ``config=``).

Diffusers arguments without an official field (patch sizes, ``vae_scale_factors``, the audio sampling rate
and hop length, ``perturbed_attn``: a processor choice without weights, ...) have no place in the metadata:
a run reading such a file takes them from ``model.config`` (their defaults otherwise). The release options
(:data:`RELEASE_FIELDS`) are written under ltx-core's names, as LTX-2.3 files carry them; ltx-core has one
switch for both streams where diffusers has two (``gated_attn`` / ``audio_gated_attn``, ``cross_attn_mod`` /
``audio_cross_attn_mod``), so a transformer whose streams differ there is refused. LTX-2.5 is refused (its
keyframe embedding's official names are not established here).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ltx2_train.version import config_version

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
RELEASE_FIELDS: dict[str, tuple[tuple[str, ...], bool]] = {
    "apply_gated_attention": (("gated_attn", "audio_gated_attn"), False),
    "cross_attention_adaln": (("cross_attn_mod", "audio_cross_attn_mod"), False),
    "caption_proj_before_connector": (("use_prompt_embeddings",), True),
    "use_prompt_adaln_single": (("use_prompt_adaln_single",), False),
    "ff_bias": (("ff_bias",), False),
    "audio_ff_bias": (("audio_ff_bias",), False),
}  # fmt: skip
"""Official release field -> (the diffusers arguments it stands for, whether negated): ltx-core's
``transformer`` options (those :data:`ltx2_train.version.SINGLE_FILE_OPTIONS` reads the release from, plus
``audio_ff_bias``); one official switch sets both streams' diffusers arguments."""
EXPORTED_RELEASES = ("2.0", "2.3")
"""The releases whose official single file this app writes (module docstring)."""


def official_transformer_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The metadata's ``transformer`` section for diffusers constructor arguments ``config`` (complete: the
    source's ``config.json`` over the class defaults): the shape, and the release fields
    (:data:`RELEASE_FIELDS`) of LTX-2.0 or 2.3.

    Raises:
        ValueError: an LTX-2.5 transformer, two diffusers arguments of one official switch that differ, or
            a ``qk_norm`` ltx-core does not have.
    """
    release = config_version(config, "the transformer's config")
    if release not in EXPORTED_RELEASES:
        raise ValueError(
            f"the official single-file layout is written for LTX-{' and '.join(EXPORTED_RELEASES)} "
            f"transformers; this one is LTX-{release}'s"
        )
    if config["qk_norm"] != "rms_norm_across_heads":
        raise ValueError(
            f"qk_norm {config['qk_norm']!r}: the official transformer has rms_norm_across_heads only"
        )
    out = {name: config[name] for name in SAME_NAMES}
    out.update(release_fields(config))
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


def release_fields(config: Mapping[str, Any]) -> dict[str, bool]:
    """The official release fields (:data:`RELEASE_FIELDS`) of diffusers arguments ``config``.

    Raises:
        ValueError: the diffusers arguments of one official switch differ (``gated_attn`` true and
            ``audio_gated_attn`` false, say), which ltx-core cannot express.
    """
    out = {}
    for field, (names, negated) in RELEASE_FIELDS.items():
        values = {name: bool(config[name]) for name in names}
        if len(set(values.values())) > 1:
            raise ValueError(
                f"{', '.join(f'{k}={str(v).lower()}' for k, v in values.items())}: the official config has "
                f"one switch for both streams ({field}); the official single file cannot hold this transformer"
            )
        value = next(iter(values.values()))
        out[field] = not value if negated else value
    return out


def diffusers_transformer_config(official: Mapping[str, Any]) -> dict[str, Any]:
    """Diffusers constructor arguments from the metadata's ``transformer`` section (inverse of
    :func:`official_transformer_config` on the fields it writes, each release field setting both streams'
    arguments, :data:`RELEASE_FIELDS`; fields it does not know are left out)."""
    out = {name: official[name] for name in SAME_NAMES if name in official}
    for key, (names, negated) in RELEASE_FIELDS.items():  # the release options (ltx2_train.version)
        if key in official:
            out.update(dict.fromkeys(names, not official[key] if negated else bool(official[key])))
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


CONNECTORS = ("video_embeddings_connector.", "audio_embeddings_connector.")
"""The text connectors a release file holds under the transformer's prefix (diffusers' ``LTX2TextConnectors``;
:mod:`ltx2_train.release_file` reads them)."""
TRANSFORMER_KEY_MAP = "ltx2_transformer"
"""The predictor's weight transform: mm-checkpoint's ``ltx2`` map with the text connectors left out, so that
an official release file's transformer loads (its VAEs and vocoder mm-checkpoint's ComfyUI view hides)."""


class TransformerWeights:
    """mm-checkpoint's ``ltx2`` key map over the transformer's keys alone: the release file's text connectors
    (:data:`CONNECTORS`, under the transformer's prefix) are not transformer weights in diffusers."""

    def __init__(self) -> None:
        from mm_checkpoint import get_weight_transform

        self.names = get_weight_transform("ltx2")

    def plan_load(self, checkpoint_keys: Iterable[str]) -> dict[str, Any]:
        return self.names.plan_load([k for k in checkpoint_keys if not k.startswith(CONNECTORS)])

    def plan_export(self, model_keys: Iterable[str]) -> dict[str, Any]:
        return self.names.plan_export(model_keys)


def read_single_file_config(path: str | Path) -> dict[str, Any]:
    """Diffusers constructor arguments from the metadata of the single file ``path`` (empty when it has none).
    The file may be the transformer alone or a release file bundling the VAEs, vocoder and connectors.

    Raises:
        ValueError: the ``config`` entry is not JSON with a ``transformer`` object; naming the file.
    """
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        metadata = f.metadata() or {}
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
