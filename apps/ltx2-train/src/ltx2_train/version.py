"""Which LTX-2 release (2.0, 2.3 or 2.5) a transformer checkpoint is, read from the checkpoint itself.

Never from a flag of the user's: the release is what the checkpoint's own architecture options say.
They are the ``LTX2VideoTransformer3DModel`` arguments below (a diffusers folder's ``config.json``; a
key the file leaves out means the argument's default, as ``from_pretrained`` reads it):

========================  =====  =====  =====
argument                  2.0    2.3    2.5
========================  =====  =====  =====
``gated_attn``            false  true   true
``cross_attn_mod``        false  true   true
``use_prompt_embeddings`` true   false  false
``ff_bias``               true   true   false
``use_prompt_adaln_single`` true true   false
========================  =====  =====  =====

2.3 added gated attention and prompt-modulated cross-attention and moved the caption projection into the
text connectors; 2.5 dropped the video feed-forward bias and made the prompt's cross-attention modulation
a fixed table (cacheable over the denoising steps). Any other combination is refused, naming the file and
the fields. Other options (``perturbed_attn``, the audio side's ``audio_gated_attn`` / ``audio_ff_bias``,
``use_keyframes_abs_pos_embedding``, ``vae_scale_factors``) are the checkpoint's own shape and decide nothing.

The official single-file checkpoint (one ``.safetensors``) carries its configuration as JSON in the header's
metadata: ``config`` with a ``transformer`` section in the original code's option names
(``apply_gated_attention``, ``cross_attention_adaln``, ``caption_proj_before_connector``, ``ff_bias``,
``use_prompt_adaln_single``: :data:`SINGLE_FILE_OPTIONS`) and a ``model_version`` (``"2.5"``, ``"2.5.0"``; at
the top level of the metadata or of ``config``). The release follows from the options as above; a
``model_version`` that says another is refused (the file contradicts itself).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: The arguments that tell the releases apart (module docstring), with each release's values.
VERSION_SIGNATURES: dict[str, dict[str, bool]] = {
    "2.0": {"gated_attn": False, "cross_attn_mod": False, "use_prompt_embeddings": True, "ff_bias": True,
            "use_prompt_adaln_single": True},
    "2.3": {"gated_attn": True, "cross_attn_mod": True, "use_prompt_embeddings": False, "ff_bias": True,
            "use_prompt_adaln_single": True},
    "2.5": {"gated_attn": True, "cross_attn_mod": True, "use_prompt_embeddings": False, "ff_bias": False,
            "use_prompt_adaln_single": False},
}  # fmt: skip
VERSION_FIELDS: tuple[str, ...] = tuple(VERSION_SIGNATURES["2.0"])
#: The diffusers argument's default where a ``config.json`` leaves it out (``LTX2VideoTransformer3DModel``'s).
FIELD_DEFAULTS = VERSION_SIGNATURES["2.0"]
#: Official single-file option -> (diffusers argument, whether the value is negated); defaults of the
#: original code where the metadata leaves one out: those of 2.0.
SINGLE_FILE_OPTIONS: dict[str, tuple[str, bool]] = {
    "apply_gated_attention": ("gated_attn", False),
    "cross_attention_adaln": ("cross_attn_mod", False),
    "caption_proj_before_connector": ("use_prompt_embeddings", True),
    "ff_bias": ("ff_bias", False),
    "use_prompt_adaln_single": ("use_prompt_adaln_single", False),
}


def config_version(config: Mapping[str, Any], source: str) -> str:
    """The release whose signature the transformer arguments ``config`` have (missing ones at their
    defaults); ``source`` names where they come from in the error for an unknown combination."""
    values = {field: bool(config.get(field, FIELD_DEFAULTS[field])) for field in VERSION_FIELDS}
    for version, signature in VERSION_SIGNATURES.items():
        if values == signature:
            return version
    known = "; ".join(f"{v}: {_fields(s)}" for v, s in VERSION_SIGNATURES.items())
    raise ValueError(
        f"{source}: the LTX-2 transformer options {_fields(values)} are no known LTX-2 release; "
        f"expected those of one of {known}"
    )


def folder_version(folder: str | Path) -> str:
    """The release of a diffusers transformer folder, from its ``config.json``."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no config.json, so the LTX-2 release cannot be read from {folder}")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not JSON ({err})") from err
    return config_version(config, str(path))


def single_file_version(path: str | Path) -> str:
    """The release of an official single-file checkpoint, from its safetensors metadata (module docstring)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata() or {}
    try:
        config = json.loads(metadata["config"])
        transformer = config["transformer"]
    except (KeyError, TypeError, json.JSONDecodeError) as err:
        raise ValueError(
            f"{path}: no 'config' metadata (JSON) with a 'transformer' section, as the official LTX-2 single "
            f"files carry; its metadata keys: {sorted(metadata)}"
        ) from err
    options = {
        name: (not transformer[key]) if negated else transformer[key]
        for key, (name, negated) in SINGLE_FILE_OPTIONS.items()
        if key in transformer
    }
    version = config_version(options, f"{path} (metadata config.transformer)")
    stated = metadata.get("model_version") or config.get("model_version")
    if stated is not None and _major_minor(str(stated)) != version:
        raise ValueError(
            f"{path}: its metadata says model_version {stated!r} but its transformer options "
            f"{_fields({k: transformer[k] for k in SINGLE_FILE_OPTIONS if k in transformer}) or '(none: 2.0 defaults)'} "
            f"are LTX-{version}'s"
        )
    return version


def checkpoint_version(path: str | Path) -> str:
    """The release of ``path``: a diffusers transformer folder or an official single ``.safetensors`` file."""
    path = Path(path)
    return single_file_version(path) if path.is_file() else folder_version(path)


def contradictions(overrides: Mapping[str, Any], checkpoint: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """The release-deciding arguments that ``overrides`` (``model.config``) set to another value than the
    checkpoint's ``config.json`` holds: ``{field: (override, checkpoint's)}``."""
    return {
        field: (overrides[field], checkpoint.get(field, FIELD_DEFAULTS[field]))
        for field in VERSION_FIELDS
        if field in overrides and bool(overrides[field]) != bool(checkpoint.get(field, FIELD_DEFAULTS[field]))
    }


def _major_minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def _fields(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={str(v).lower()}" for k, v in values.items())
