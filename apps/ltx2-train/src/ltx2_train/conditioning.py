"""Clean context tokens of the LTX-2 pipeline: IC-LoRA reference tokens and clean leading audio frames.

Facts of diffusers' ``LTX2ICLoraPipeline`` (0.42, ``prepare_latents`` / ``_encode_reference_conditions``)
that the reference tokens follow:

* the reference clip's latents are packed with the transformer's patches and **appended after** the
  target's tokens (``[target | reference]``), video to video; the transformer's outputs on them are
  dropped;
* their RoPE coordinates are ``rope.prepare_video_coords`` of the reference's own latent grid at the
  clip's frame rate, from time 0: a reference of the target's shape sits at exactly the target's
  positions (the official trainer's ``video_to_video`` strategy places its reference the same way, before
  the target instead of after: attention is order-free, so the outputs agree);
* their per-token timestep is ``t * (1 - strength)``: 0 at strength 1, the only strength training uses.

Reference audio (IC-LoRA for audio) is placed the same way on the audio stream: appended after the
target's audio tokens, at ``audio_rope.prepare_audio_coords`` of its own length (from time 0), timestep 0.
Under sequence parallelism the appended tokens, their coordinates and timesteps are split with the
stream like any token (``ltx2_train.context_parallel``): the forward takes the coordinates explicitly.
"""

from __future__ import annotations

from typing import Any

import torch


def per_token(timestep: torch.Tensor, batch: int, length: int) -> torch.Tensor:
    """``[B, length]``: a per-sample timestep ``[B]`` repeated over the tokens, a per-token one as is."""
    if timestep.dim() == 2:
        return timestep
    return timestep.reshape(-1, 1).expand(batch, length)


def leading_frames_mask(
    batch: int, length: int, frames: int, device: torch.device | str | None = None
) -> torch.Tensor:
    """``[B, length]`` bool: True on the first ``frames`` tokens of every sample (audio: one token per
    latent frame)."""
    mask = torch.zeros(batch, length, dtype=torch.bool, device=device)
    mask[:, :frames] = True
    return mask


def with_references(
    model: Any, noised: dict[str, Any], video: torch.Tensor, audio: torch.Tensor, timestep: torch.Tensor,
    audio_timestep: torch.Tensor,
) -> dict[str, Any]:  # fmt: skip
    """The transformer's token inputs with the reference tokens of ``noised`` appended (module docstring).

    ``noised["reference_video"]`` ``[B, R, D]`` (with ``reference_grid``) and ``noised["reference_audio"]``
    ``[B, Ra, D_a]`` are optional; without either the inputs are returned unchanged (no coordinates: the
    transformer computes its own). Timesteps are already scaled (``1000 sigma``)."""
    out = {"hidden_states": video, "audio_hidden_states": audio, "timestep": timestep,
           "audio_timestep": audio_timestep}  # fmt: skip
    ref_video, ref_audio = noised.get("reference_video"), noised.get("reference_audio")
    if ref_video is None and ref_audio is None:
        return out
    batch, device = video.size(0), video.device
    frames, height, width = noised["grid"]
    fps = noised["frame_rate"]
    video_coords = model.rope.prepare_video_coords(batch, frames, height, width, device, fps=fps)
    audio_coords = model.audio_rope.prepare_audio_coords(batch, audio.size(1), device)
    if ref_video is not None:
        ref_frames, ref_height, ref_width = noised["reference_grid"]
        ref_coords = model.rope.prepare_video_coords(
            batch, ref_frames, ref_height, ref_width, device, fps=fps
        )
        out["hidden_states"] = torch.cat([video, ref_video.to(video.dtype)], dim=1)
        video_coords = torch.cat([video_coords, ref_coords], dim=2)
        out["timestep"] = _with_zeros(per_token(timestep, batch, video.size(1)), ref_video.size(1))
    if ref_audio is not None:
        ref_coords = model.audio_rope.prepare_audio_coords(batch, ref_audio.size(1), device)
        out["audio_hidden_states"] = torch.cat([audio, ref_audio.to(audio.dtype)], dim=1)
        audio_coords = torch.cat([audio_coords, ref_coords], dim=2)
        out["audio_timestep"] = _with_zeros(
            per_token(audio_timestep, batch, audio.size(1)), ref_audio.size(1)
        )
    return {**out, "video_coords": video_coords, "audio_coords": audio_coords}


def _with_zeros(timestep: torch.Tensor, count: int) -> torch.Tensor:
    """``[B, S]`` -> ``[B, S + count]``: timestep 0 on ``count`` appended tokens."""
    return torch.cat([timestep, timestep.new_zeros(timestep.size(0), count)], dim=1)
