"""Small tensor adapters: sub-model outputs to tensors, and Wan2.2 first-frame conditioning."""

from __future__ import annotations

from typing import Any

import torch


def as_tensor_output(output: Any, what: str) -> torch.Tensor:
    """A sub-model output as a tensor.

    Accepts a tensor, an object with ``last_hidden_state`` (transformers encoders) or
    ``sample`` (diffusers models), or a tuple/list whose first element is the tensor.
    """
    if isinstance(output, torch.Tensor):
        return output
    for attr in ("last_hidden_state", "sample"):
        value = getattr(output, attr, None)
        if isinstance(value, torch.Tensor):
            return value
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise TypeError(
        f"{what} returned {type(output).__name__}; expected a Tensor, an object with "
        "'last_hidden_state' or 'sample', or a tuple whose first element is a Tensor"
    )


def masked_text_embeddings(embeddings: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """Zero the embeddings of padding tokens (as Wan does before cross-attention).

    Args:
        embeddings: ``[B, L, D]`` text encoder output.
        attention_mask: ``[B, L]`` with 1 for real tokens, or ``None`` to keep all.
    """
    if embeddings.ndim != 3:
        raise ValueError(f"text embeddings must be [B, L, D], got shape {tuple(embeddings.shape)}")
    if attention_mask is None:
        return embeddings
    if attention_mask.shape != embeddings.shape[:2]:
        raise ValueError(
            f"attention_mask shape {tuple(attention_mask.shape)} does not match embeddings "
            f"[B, L] = {tuple(embeddings.shape[:2])}"
        )
    return embeddings * attention_mask.to(embeddings.device, embeddings.dtype).unsqueeze(-1)


def first_frame_video(video: torch.Tensor) -> torch.Tensor:
    """``[B, C, F, H, W]`` video keeping frame 0 and zeroing the rest (the I2V VAE input)."""
    _check_5d(video, "video")
    rest = torch.zeros_like(video[:, :, 1:])
    return torch.cat([video[:, :, :1], rest], dim=2)


def first_frame_mask(latents: torch.Tensor, channels: int = 4) -> torch.Tensor:
    """``[B, channels, T, H, W]`` mask: ones on latent frame 0, zeros elsewhere.

    Wan2.2 I2V builds the mask over pixel frames and folds the VAE's temporal stride
    (4) into channels, which yields exactly this for a first-frame-only condition.
    """
    _check_5d(latents, "latents")
    b, _, t, h, w = latents.shape
    mask = latents.new_zeros(b, channels, t, h, w)
    mask[:, :, 0] = 1.0
    return mask


def i2v_condition(latents: torch.Tensor, image_latents: torch.Tensor, mask_channels: int = 4) -> torch.Tensor:
    """Wan2.2 I2V channel condition ``cat([mask, image_latents], dim=1)``.

    Concatenated after the noisy latents it gives the predictor ``C + mask_channels + C``
    input channels (36 = 16 + 4 + 16 for Wan2.2 I2V A14B).
    """
    _check_5d(image_latents, "image_latents")
    if image_latents.shape[0] != latents.shape[0] or image_latents.shape[2:] != latents.shape[2:]:
        raise ValueError(
            f"image_latents shape {tuple(image_latents.shape)} must match latents "
            f"{tuple(latents.shape)} in batch, frames, height and width"
        )
    mask = first_frame_mask(latents, mask_channels).to(image_latents.dtype)
    return torch.cat([mask, image_latents.to(latents.device)], dim=1)


def replace_first_frame(noisy: torch.Tensor, clean: torch.Tensor) -> torch.Tensor:
    """``noisy`` with latent frame 0 replaced by ``clean``'s frame 0 (Wan2.2 TI2V)."""
    _check_5d(noisy, "noisy latents")
    if noisy.shape != clean.shape:
        raise ValueError(f"noisy shape {tuple(noisy.shape)} != clean shape {tuple(clean.shape)}")
    return torch.cat([clean[:, :, :1].to(noisy.dtype), noisy[:, :, 1:]], dim=2)


def _check_5d(x: torch.Tensor, what: str) -> None:
    if x.ndim != 5:
        raise ValueError(f"{what} must be [B, C, T, H, W], got shape {tuple(x.shape)}")
