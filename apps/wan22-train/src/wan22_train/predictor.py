"""The Wan2.2 predictor as a trainer sub-model: ``WanDiT`` + weight loading + context parallelism."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from mm_checkpoint import LoadReport
from mm_parallel import ParallelState, SequenceParallelPlan
from mm_trainer import BaseModel, model_register

from wan22_train.model import WanDiT, WanDiTConfig
from wan22_train.model.packing import context_parallel_ops
from wan22_train.release import Component, component_path, resolved_args, source_of

RELEASE_KEYS = ("expert",)
"""Keys of the predictor's ``config`` that pick its files in a release root, not ``WanDiTConfig`` fields."""


def predictor_component(args: Any) -> Component:
    """Which DiT of a release root the predictor reads: its ``config.expert`` (``high_noise`` /
    ``low_noise``: ``high_noise_model/`` or ``transformer/``, ``low_noise_model/`` or ``transformer_2/``),
    else the one DiT of a TI2V-5B root."""
    expert = (args.config or {}).get("expert")
    return expert if expert in ("high_noise", "low_noise") else "dit"


def predictor_source(args: Any) -> Path | None:
    """The predictor's weights folder (or file): its source, or its DiT in a release root."""
    return component_path(source_of(args), predictor_component(args))


def predictor_config(args: Any) -> WanDiTConfig:
    """``WanDiTConfig`` from the source's ``config.json`` (diffusers or native), updated by ``args.config``."""
    overrides = {k: v for k, v in (args.config or {}).items() if k not in RELEASE_KEYS}
    source = predictor_source(args)
    if source and (Path(source) / "config.json").is_file():
        config = WanDiTConfig.from_file(Path(source) / "config.json")
        for key, value in overrides.items():
            if not hasattr(config, key):
                raise ValueError(f"model.models.<predictor>.config.{key}: not a WanDiTConfig field")
            setattr(config, key, tuple(value) if isinstance(value, list) else value)
        config.__post_init__()
        return config
    if not overrides:
        raise ValueError(
            "the Wan predictor needs either from_pretrained/checkpoint_path with a config.json or a `config` "
            "section with its shape (dim, num_heads, num_layers, ...)"
        )
    return WanDiTConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in overrides.items()})


@model_register("wan2_2_predictor")
class WanPredictor(BaseModel, WanDiT):
    """``WanDiT`` built from a config section; weights through mm-checkpoint's ``wan2_2`` key map."""

    weight_transform_model_type = "wan2_2"

    @classmethod
    def build_from_config(cls, args: Any) -> WanPredictor:
        return cls(predictor_config(args))

    @classmethod
    def from_pretrained(cls, args: Any) -> WanPredictor:
        model = cls.build_from_config(args)
        model.setup_weights(args)
        return model

    def setup_weights(self, args: Any) -> LoadReport | None:
        """Load the DiT weights (diffusers or native names) from its source, or its expert's folder in a
        release root."""
        return super().setup_weights(resolved_args(args, predictor_component(args)))

    def random_init(self) -> None:
        self.init_weights()

    def training_flops(self, video_tokens: int, text_tokens: int) -> float:
        """Matmul FLOPs of one sample's forward + backward (3x forward): the blocks' projections,
        self-attention over the video tokens and cross-attention to the text (embeddings and head,
        under 1% at real sizes, left out). Used for the MFU metric."""
        c, s, t = self.config, video_tokens, text_tokens
        per_layer = 2 * s * (6 * c.dim**2 + 2 * c.dim * c.ffn_dim) + 2 * t * 2 * c.dim**2
        per_layer += 4 * s * s * c.dim + 4 * s * t * c.dim
        return 3.0 * c.num_layers * per_layer

    def tokens_per_sample(self, latent_shape: tuple[int, ...]) -> int:
        """Video tokens after patchify for latents ``[c, T, h, w]``."""
        return math.prod(s // p for s, p in zip(latent_shape[1:], self.config.patch_size))

    def setup_context_parallel(self, parallel_state: ParallelState) -> None:
        """Ulysses x Ring over the video tokens (split after patch embedding, gathered before the head).

        A token count that does not split evenly is zero-padded at the end; self-attention is told
        the real token count (ring blocks are cut to their real keys) and the gather drops the
        padded outputs (:class:`mm_parallel.SequenceParallelPlan`, zigzag ring layout). The Ulysses
        all-to-all overlaps the projections / head groups as ``parallel_state.ulysses_overlap`` says.
        """
        plan = SequenceParallelPlan.from_parallel_state(parallel_state, layout="zigzag")
        self.enable_context_parallel(plan.split, plan.gather, plan.attention)
        self.packing_fn = context_parallel_ops(plan)  # a packed forward: every sample split on its own
