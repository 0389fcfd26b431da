"""Qwen2.5-VL as a trainer model: the upstream class, module groups, one vision pass, packed 3-D positions.

Module paths under the single-model container (for ``parallel.fsdp_plan`` and
``features.recompute_plan``)::

    model.model.visual.patch_embed          # vision_tower
    model.model.visual.blocks.{*}           # vision_tower: one FSDP unit per block
    model.model.visual.merger               # multi_modal_projector
    model.model.language_model.embed_tokens # language_model
    model.model.language_model.layers.{*}   # language_model: one FSDP unit per decoder layer
    model.model.language_model.norm, model.lm_head

One vision pass: every forward runs the vision tower exactly once, over the images and videos of the
micro-batch together (upstream runs it once per modality present), and over a dummy image whose
features count zero when there is no media. Every rank then runs the same FSDP collectives (all-gather
and reduce-scatter of the vision blocks) whatever media its micro-batch holds.

Packing: the collator gives 1-D text positions restarting per sample; :meth:`forward` turns them into
the ``[4, 1, L]`` positions upstream reads for packed rows (text positions for the mask, then the
temporal / height / width rotary positions of each sample from upstream ``get_rope_index``).
"""

from __future__ import annotations

from typing import Any

import torch
from mm_trainer import HFModel, model_register
from transformers import Qwen2_5_VLForConditionalGeneration
from transformers.modeling_outputs import BaseModelOutputWithPooling

import qwen_vl_train.config_schema  # noqa: F401  (the model config schema, torch-free)

GROUPS = {
    "vision_tower": ("model.visual.patch_embed", "model.visual.blocks"),
    "multi_modal_projector": ("model.visual.merger",),
    "language_model": ("model.language_model", "lm_head"),
}


class QwenVLTraining(HFModel):
    """Qwen-VL specifics on top of :class:`~mm_trainer.HFModel`."""

    module_groups = GROUPS

    def forward(
        self,
        position_ids: torch.Tensor | None = None,
        pixel_values: torch.Tensor | None = None,
        pixel_values_videos: torch.Tensor | None = None,
        **batch: Any,
    ) -> Any:
        if position_ids is not None and position_ids.ndim == 2:
            position_ids = self.packed_position_ids(position_ids, batch)
        encoded, anchor = self.encode_media(pixel_values, pixel_values_videos, batch)
        output = super().forward(position_ids=position_ids, mm_encoder_outputs=encoded, **batch)
        if anchor is not None:
            output.loss = output.loss + anchor
        return output

    def encode_media(
        self,
        pixel_values: torch.Tensor | None,
        pixel_values_videos: torch.Tensor | None,
        batch: dict[str, Any],
    ) -> tuple[dict[str, BaseModelOutputWithPooling] | None, torch.Tensor | None]:
        """One vision-tower pass over images then videos -> upstream ``mm_encoder_outputs``; without
        media, a pass over a dummy image and a zero loss term that keeps the tower in the backward."""
        visual = self.model.visual
        merge = visual.spatial_merge_size
        media = [
            (kind, x, batch[grid])
            for kind, x, grid in (
                ("image", pixel_values, "image_grid_thw"),
                ("video", pixel_values_videos, "video_grid_thw"),
            )
            if x is not None
        ]
        if not media:
            config = visual.config
            width = config.in_channels * config.temporal_patch_size * config.patch_size**2
            dummy = torch.zeros(merge * merge, width, dtype=visual.dtype, device=self.lm_head.weight.device)
            grid = torch.tensor([[1, merge, merge]], device=dummy.device)
            return None, 0.0 * visual(dummy, grid_thw=grid).pooler_output.sum()
        grids = torch.cat([grid for _, _, grid in media])
        features = visual(
            torch.cat([x for _, x, _ in media]).type(visual.dtype), grid_thw=grids
        ).pooler_output
        chunks = torch.split(features, (grids.prod(-1) // merge**2).tolist())
        encoded, start = {}, 0
        for kind, _, grid in media:
            encoded[kind] = BaseModelOutputWithPooling(pooler_output=chunks[start : start + len(grid)])
            start += len(grid)
        return encoded, None

    def packed_position_ids(self, text_positions: torch.Tensor, batch: dict[str, Any]) -> torch.Tensor:
        """``[1, L]`` positions restarting at 0 per sample -> ``[4, 1, L]`` (text, then t / h / w)."""
        if text_positions.shape[0] != 1 or "attention_mask" in batch:
            raise ValueError("packed position_ids: expected one packed row [1, L] and no attention_mask")
        length = text_positions.shape[1]
        starts = (text_positions[0] == 0).nonzero().flatten().tolist() + [length]
        spans = list(zip(starts[:-1], starts[1:]))
        widest = max(end - start for start, end in spans)
        ids = batch["input_ids"].new_zeros(len(spans), widest)
        types, mask = torch.zeros_like(ids), torch.zeros_like(ids)
        for row, (start, end) in enumerate(spans):  # one padded row per sample
            ids[row, : end - start] = batch["input_ids"][0, start:end]
            types[row, : end - start] = batch["mm_token_type_ids"][0, start:end]
            mask[row, : end - start] = 1
        rope, _ = self.model.get_rope_index(
            ids,
            types,
            image_grid_thw=batch.get("image_grid_thw"),
            video_grid_thw=batch.get("video_grid_thw"),
            second_per_grid_ts=batch.get("second_per_grid_ts"),
            attention_mask=mask,
        )
        rope = torch.cat([rope[:, row, : end - start] for row, (start, end) in enumerate(spans)], dim=1)
        return torch.cat([text_positions[None], rope[:, None]], dim=0)


@model_register("qwen2_5_vl")
class Qwen2_5_VLForTraining(QwenVLTraining, Qwen2_5_VLForConditionalGeneration):
    """``Qwen2_5_VLForConditionalGeneration`` for training (keys and module tree upstream's)."""
