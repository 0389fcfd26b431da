"""What each LTX-2 release's transformer forward takes besides the token streams and ``timestep`` /
``audio_timestep``: its prompt-modulation timesteps and the width of its text embeddings.

Facts of diffusers' ``LTX2VideoTransformer3DModel`` (0.42) and its LTX-2 pipelines:

* 2.3 (``cross_attn_mod`` with ``use_prompt_adaln_single``) modulates the text cross-attention's keys and
  values by ``prompt_adaln(sigma)`` / ``audio_prompt_adaln(audio_sigma)``; 2.5 replaces that by a fixed
  table (``use_prompt_adaln_single: false``). Both read the other stream's sigma for the audio<->video
  cross-attention's modulation and gate (``use_cross_timestep=True``, "the LTX-2.3/2.5 behaviour").
  diffusers' pipelines pass ``sigma=timestep`` (the sample's timestep, ``1000 x sigma``, before the
  conditioning tokens' zeroing: ``LTX2ConditionPipeline`` gives the per-token video timestep and the
  per-sample ``sigma`` apart), ``audio_sigma`` = the audio timestep, and ``use_cross_timestep=True``.
* 2.0 takes none of them: no prompt modulation, and each stream's cross-attention modulation reads its
  own timestep (``use_cross_timestep=False``, the legacy behaviour).
* Text width: 2.0 projects the captions itself (``caption_projection``: ``caption_channels`` wide for
  both streams); 2.3 and 2.5 have no caption projection (``use_prompt_embeddings: false``, the
  connectors project per modality), so the video text is ``cross_attention_dim`` wide and the audio
  text ``audio_cross_attention_dim``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ltx2_train.version import config_version

#: The releases whose forward takes ``sigma`` / ``audio_sigma`` and the cross timestep (module docstring).
SIGMA_RELEASES = frozenset({"2.3", "2.5"})


def release_of(model: Any) -> str:
    """The LTX-2 release of a transformer, from its config (:func:`ltx2_train.version.config_version`)."""
    return config_version(model.config, "the transformer's config")


def sigma_inputs(release: str, sigma: torch.Tensor, audio_sigma: torch.Tensor) -> dict[str, Any]:
    """The forward keywords of ``release``'s prompt modulation, from the per-sample timesteps ``[B]`` of
    each stream (``1000 x sigma``, as ``timestep``): ``sigma``, ``audio_sigma`` and
    ``use_cross_timestep=True`` for 2.3 and 2.5; nothing for 2.0."""
    if release not in SIGMA_RELEASES:
        return {}
    if sigma.dim() != 1 or audio_sigma.dim() != 1:
        raise ValueError(
            f"LTX-{release} prompt modulation: sigma and audio_sigma are one value per sample, got shapes "
            f"{tuple(sigma.shape)} and {tuple(audio_sigma.shape)}"
        )
    return {"sigma": sigma, "audio_sigma": audio_sigma, "use_cross_timestep": True}


def text_widths(config: Mapping[str, Any] | Any) -> tuple[int, int]:
    """``(video, audio)`` width of the text embeddings the transformer of ``config`` (its diffusers config, a
    mapping or a namespace) takes (module docstring)."""
    config = config if isinstance(config, Mapping) else vars(config)
    if config.get("use_prompt_embeddings", True):
        width = int(config["caption_channels"])
        return width, width
    return int(config["cross_attention_dim"]), int(config["audio_cross_attention_dim"])


def text_width_problem(config: Mapping[str, Any] | Any, release: str, video: int, audio: int) -> str | None:
    """Why text embeddings ``video`` / ``audio`` wide do not fit the LTX-``release`` transformer of
    ``config`` (the cache's text side made for another release, say), or None when they do."""
    want = text_widths(config)
    if (video, audio) == want:
        return None
    side = "2.0's (one caption projection)" if release == "2.0" else f"{release}'s (per-modality projections)"
    return (
        f"text embeddings (video, audio) {video} and {audio} wide; the LTX-{release} transformer takes "
        f"{want[0]} and {want[1]}: preprocess the captions with the connectors of {side} text side"
    )
