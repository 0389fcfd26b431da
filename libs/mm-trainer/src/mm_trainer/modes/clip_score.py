"""The built-in ``clip_score`` reward: how well a clip's frames match its prompt by a CLIP model.

score = mean over the scored frames f of cos(text_embed(prompt), image_embed(frame f)), in [-1, 1]: the
projected embeddings of transformers' ``CLIPModel`` (``get_text_features`` / ``get_image_features``), a
plain cosine, without CLIP's logit scale. The model, its tokenizer and ``preprocessor_config.json`` come
from a local folder (``model_path``; never a hub download), the model frozen and in eval mode on the
run's device. Frames are prepared there too, in torch, by the folder's processor settings: resize of the
shortest edge (bicubic, antialiased), centre crop, then ``(x - mean) / std`` on a 0-1 scale; a frame
already at the crop size is only normalised, as the processor does. The frames of a batch go through the
image tower ``batch_size`` at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from mm_trainer.model.hf_model import import_transformers
from mm_trainer.registry.registries import reward_register


class ImageTransform:
    """A CLIP image processor's settings as a torch transform: frames ``[N, 3, H, W]`` in [-1, 1] ->
    pixel values ``[N, 3, crop_h, crop_w]``. Read from the upstream processor loaded from the folder, which
    fills its defaults and normalises the size forms (an int ``size`` is the shortest edge)."""

    def __init__(self, processor: Any) -> None:
        size = processor.size if processor.do_resize else None
        self.shortest_edge = getattr(size, "shortest_edge", None)
        self.exact = (size.height, size.width) if size is not None and getattr(size, "height", None) else None
        crop = processor.crop_size if processor.do_center_crop else None
        self.crop = (crop.height, crop.width) if crop is not None else None
        self.mean = torch.tensor(processor.image_mean if processor.do_normalize else [0.0] * 3)
        self.std = torch.tensor(processor.image_std if processor.do_normalize else [1.0] * 3)

    @classmethod
    def from_folder(cls, folder: Path) -> ImageTransform:
        if not (folder / "preprocessor_config.json").is_file():
            raise ValueError(
                f"{folder / 'preprocessor_config.json'} not found: the CLIP folder's image settings"
            )
        transformers = import_transformers("the clip_score reward")
        return cls(transformers.CLIPImageProcessorPil.from_pretrained(folder))

    def __call__(self, frames: torch.Tensor) -> torch.Tensor:
        x = ((frames.float() + 1) / 2).clamp(0, 1)  # the 0-1 scale the processor rescales uint8 to
        height, width = x.shape[-2:]
        target = self.exact or _shortest_edge_size(height, width, self.shortest_edge)
        if target != (height, width):
            x = F.interpolate(x, size=target, mode="bicubic", antialias=True, align_corners=False).clamp(0, 1)
        if self.crop is not None:
            (h, w), (ch, cw) = x.shape[-2:], self.crop
            if ch > h or cw > w:
                raise ValueError(f"clip_score: crop {self.crop} larger than the resized frame {(h, w)}")
            top, left = (h - ch) // 2, (w - cw) // 2
            x = x[..., top : top + ch, left : left + cw]
        mean, std = self.mean.to(x.device).view(1, 3, 1, 1), self.std.to(x.device).view(1, 3, 1, 1)
        return (x - mean) / std


def _folder(model_path: str) -> Path:
    folder = Path(model_path)
    if not (folder / "config.json").is_file():
        raise ValueError(f"model_path {model_path}: no config.json; expected a local CLIPModel folder")
    return folder


def _shortest_edge_size(height: int, width: int, edge: int | None) -> tuple[int, int]:
    """The size with the shorter side ``edge`` and the aspect kept (unchanged without ``edge``)."""
    if edge is None:
        return height, width
    if height <= width:
        return edge, int(edge * width / height)
    return int(edge * height / width), edge


def evenly_spaced_frames(num_frames: int, wanted: int | None) -> list[int]:
    """``wanted`` frame indices evenly spaced from the first to the last (every frame for None or more)."""
    if wanted is None or wanted >= num_frames:
        return list(range(num_frames))
    return torch.linspace(0, num_frames - 1, wanted).round().long().tolist()


@reward_register("clip_score")
class ClipScore:
    """``clip_score``: the mean cosine of the prompt's CLIP text embedding and its frames' image embeddings.

    Args:
        model_path: a local folder with a ``CLIPModel``, its tokenizer and ``preprocessor_config.json``.
        frames: frames scored per clip, evenly spaced; None: every frame.
        batch_size: frames per forward of the image tower.
    """

    inputs = "frames"

    def __init__(self, model_path: str, frames: int | None = None, batch_size: int = 64) -> None:
        transformers = import_transformers("the clip_score reward")
        folder = _folder(model_path)
        self.model = transformers.CLIPModel.from_pretrained(folder).requires_grad_(False).eval()
        self._settings(folder, frames, batch_size)

    @classmethod
    def planned(cls, model_path: str, frames: int | None = None, batch_size: int = 64) -> ClipScore:
        """The reward as ``mm-train plan`` traces it: the ``CLIPModel`` of the folder's ``config.json`` on the
        meta device (no weight read), the tokenizer and image settings read as for a run."""
        transformers = import_transformers("the clip_score reward")
        folder = _folder(model_path)
        reward = cls.__new__(cls)
        config = transformers.CLIPConfig.from_pretrained(folder)
        with torch.device("meta"):
            reward.model = transformers.CLIPModel(config).requires_grad_(False).eval()
        reward._settings(folder, frames, batch_size)
        return reward

    def _settings(self, folder: Path, frames: int | None, batch_size: int) -> None:
        transformers = import_transformers("the clip_score reward")
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
        self.transform = ImageTransform.from_folder(folder)
        self.max_length = int(self.model.config.text_config.max_position_embeddings)
        self.frames, self.batch_size = frames, batch_size

    def to(self, device: torch.device | str) -> ClipScore:
        """The model on ``device`` (the run's)."""
        self.model.to(device)
        return self

    @torch.no_grad()
    def __call__(self, samples: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        device = next(self.model.parameters()).device
        text = self.tokenizer(list(prompts), padding=True, truncation=True, max_length=self.max_length,
                              return_tensors="pt").to(device)  # fmt: skip
        text_embeds = F.normalize(
            self.model.get_text_features(**text).pooler_output.float(), dim=-1
        )  # [B, D]
        picked = samples[:, :, evenly_spaced_frames(samples.shape[2], self.frames)]  # [B, 3, K, H, W]
        size, count = picked.shape[0], picked.shape[2]
        images = picked.transpose(1, 2).flatten(0, 1)  # [B * K, 3, H, W]
        embeds = [
            self.model.get_image_features(pixel_values=self.transform(chunk.to(device))).pooler_output.float()
            for chunk in images.split(self.batch_size)
        ]
        image_embeds = F.normalize(torch.cat(embeds), dim=-1).view(size, count, -1)  # [B, K, D]
        return (image_embeds * text_embeds[:, None]).sum(-1).mean(1)


__all__ = ["ClipScore", "ImageTransform", "evenly_spaced_frames"]
