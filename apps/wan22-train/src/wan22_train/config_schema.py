"""The Wan2.2 YAML keys, checked by ``mm-config check`` before anything is built.

Imports only pydantic and mm-config (no torch), so it is installed as the ``mm_config.schemas``
entry point ``wan22`` and runs on a login node. It registers the schemas of ``model.pipeline``
(container ``wan2_2_container``) and of the ``config`` of the sub-model ids ``wan2_2_predictor``,
``umt5`` and ``wan_video_vae``, and of ``data.dataset`` of the encoder cache ``wan22_cached``, and
declares the container id, so the check knows every id the plugin registers. The option names below are the pipeline's own (``Wan22Pipeline``
imports them), so the schema and the code that reads the keys cannot drift apart.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, get_args

from mm_config import (
    ConfigModel,
    DistillOptions,
    DPOOptions,
    DType,
    GRPOOptions,
    InputPath,
    NFTOptions,
    PartialConfigModel,
    PreprocessRunConfig,
    Problem,
    RuleViolations,
    SubModelConfig,
    VideoTextDatasetConfig,
    declare_ids,
    keyword_schema,
    register_dataset_schema,
    register_model_schema,
    register_pipeline_schema,
)
from mm_config.registry import validate_plugin_dict
from pydantic import Field, ValidationInfo, field_validator, model_validator

Task = Literal["t2v", "i2v", "ti2v"]
Expert = Literal["high_noise", "low_noise", "all", "both"]
TASKS: tuple[str, ...] = get_args(Task)
EXPERTS: tuple[str, ...] = get_args(Expert)
SCHEDULER_KEYS = ("num_train_timesteps", "shift", "sigma_min", "sigma_max", "extra_one_step", "weighting")


class WanPipelineOptions(PartialConfigModel):
    """``model.pipeline`` of ``wan2_2_container`` (``Wan22Pipeline.from_options``).

    Unset scheduler keys take the expert's grid: the published recipe (shift 5, sigma_min 0,
    extra_one_step) for an A14B expert, the scheduler's defaults for ``expert: all``.
    """

    task: Task = "t2v"
    """Text-to-video, image-to-video (A14B) or text+image-to-video (TI2V-5B)."""
    expert: Expert = "all"
    """Which timestep range trains: one A14B expert, the whole range, or both experts in one run."""
    boundary: float | None = Field(default=None, gt=0, lt=1)
    """Override of the A14B expert split as a fraction of the grid (0.417 t2v, 0.358 i2v)."""
    predict_dtype: DType = None
    """Dtype the predictor's inputs (latents, text embeddings) are cast to before each call; None: not cast
    here (``parallel.fsdp_plan.param_dtype``, when set, casts every unit's inputs)."""
    num_train_timesteps: int = Field(default=1000, ge=1)
    """Grid size N (timesteps are N x sigma)."""
    shift: float = Field(default=3.0, gt=0)
    """Time shift of the sigma grid."""
    sigma_min: float = Field(default=0.003 / 1.002, ge=0, lt=1)
    """Smallest unshifted sigma."""
    sigma_max: float = Field(default=1.0, gt=0, le=1)
    """Largest unshifted sigma."""
    extra_one_step: bool = False
    """Take N+1 grid points and drop the last."""
    weighting: bool = True
    """Gaussian-in-t loss weight (False: weight 1)."""
    distill: DistillOptions | None = None
    """Few-step distillation (DMD2) of a ``teacher`` into the ``predictor``; None: ordinary training."""
    dpo: DPOOptions | None = None
    """Diffusion-DPO of the ``predictor`` on preference pairs (the ``video_pairs`` dataset) against a frozen
    reference, in the phase ``dpo``; None: ordinary training."""
    grpo: GRPOOptions | None = None
    """Flow-GRPO of the ``predictor`` on its own SDE rollouts scored by ``training.rewards``, in the phase
    ``grpo`` (t2v, expert ``all`` or ``both``); None: ordinary training."""
    nft: NFTOptions | None = None
    """DiffusionNFT of the ``predictor`` on its old policy's ODE rollouts scored by ``training.rewards``, trained
    through the forward process in the phase ``nft`` (t2v, expert ``all`` or ``both``); None: ordinary
    training."""

    input_dtype_key: ClassVar[str] = "predict_dtype"
    """The option that casts the predictor's inputs (mm-config's dtype rules then leave the sub-models'
    dtypes to the pipeline)."""

    @model_validator(mode="after")
    def _expert_keys_fit(self) -> WanPipelineOptions:
        problems = []
        if self.boundary is not None and self.expert == "all":
            problems.append(
                Problem(("boundary",), "only with expert high_noise, low_noise or both", deps=(("expert",),))
            )
        if self.task == "ti2v" and self.expert != "all":
            problems.append(
                Problem(
                    ("expert",),
                    "ti2v (TI2V-5B) is one model over the whole timestep range: expected `all`",
                    self.expert,
                    deps=(("task",),),
                )
            )
        if self.distill is not None and self.expert in ("high_noise", "low_noise"):
            problems.append(
                Problem(
                    ("distill",),
                    "distils the whole sampler: expected expert `all` or `both` (both A14B experts in one run)",
                    self.expert,
                    deps=(("expert",),),
                )
            )
        if self.dpo is not None and self.distill is not None:
            problems.append(
                Problem(("dpo",), "one training mode at a time: not with distill", deps=(("distill",),))
            )
        problems += self._grpo_problems()
        if self.sigma_min >= self.sigma_max:
            problems.append(
                Problem(
                    ("sigma_min",),
                    f"must be below sigma_max ({self.sigma_max})",
                    self.sigma_min,
                    deps=(("sigma_max",),),
                )
            )
        if problems:
            raise RuleViolations(problems)
        return self

    def _grpo_problems(self) -> list[Problem]:
        """Flow-GRPO and DiffusionNFT roll out the whole text-to-video sampler, alone among the training modes."""
        problems = []
        for mode in ("grpo", "nft"):
            if getattr(self, mode) is not None:
                problems += self._rollout_problems(mode)
        return problems

    def _rollout_problems(self, mode: str) -> list[Problem]:
        """Why the reward fine-tuning ``mode`` (``grpo`` | ``nft``) cannot run with the other keys."""
        problems = []
        if self.task != "t2v":
            problems.append(
                Problem(
                    (mode,), "rolls out text-to-video only: expected task t2v", self.task, deps=(("task",),)
                )
            )
        if self.expert in ("high_noise", "low_noise"):
            problems.append(
                Problem(
                    (mode,),
                    "samples the whole schedule: expected expert `all` or `both` (both A14B experts in one run)",
                    self.expert,
                    deps=(("expert",),),
                )
            )
        others = ("distill", "dpo", "grpo") if mode == "nft" else ("distill", "dpo")
        for other in others:
            if getattr(self, other) is not None:
                problems.append(
                    Problem((mode,), f"one training mode at a time: not with {other}", deps=((other,),))
                )
        return problems


class WanPredictorConfig(PartialConfigModel):
    """``config`` of ``wan2_2_predictor``: ``WanDiTConfig`` fields, applied over the source's
    ``config.json`` (or the whole shape when there is no source)."""

    model_type: Task = "t2v"
    """Input layout: t2v, i2v (mask + image latents concatenated) or ti2v."""
    patch_size: list[int] = Field(default=[1, 2, 2], min_length=3, max_length=3)
    """(frames, height, width) of the patch embedding."""
    text_len: int = Field(default=512, ge=1)
    """Text tokens prompts are padded to."""
    in_dim: int = Field(default=16, ge=1)
    """Latent channels in."""
    dim: int = Field(default=2048, ge=1)
    """Hidden size."""
    ffn_dim: int = Field(default=8192, ge=1)
    """Feed-forward hidden size."""
    freq_dim: int = Field(default=256, ge=1)
    """Sinusoidal timestep embedding size."""
    text_dim: int = Field(default=4096, ge=1)
    """Text-encoder embedding size."""
    out_dim: int = Field(default=16, ge=1)
    """Latent channels out."""
    num_heads: int = Field(default=16, ge=1)
    """Attention heads."""
    num_layers: int = Field(default=32, ge=1)
    """Transformer blocks."""
    qk_norm: bool = True
    """RMSNorm over the query/key projections."""
    cross_attn_norm: bool = True
    """LayerNorm before cross-attention."""
    eps: float = Field(default=1e-6, gt=0)
    """Epsilon of every norm."""
    rope_max_seq_len: int = Field(default=1024, ge=1)
    """Largest post-patch frame/height/width index RoPE supports."""
    rope_theta: float = Field(default=10000.0, gt=0)
    """RoPE base."""
    expert: Literal["high_noise", "low_noise"] | None = None
    """Which A14B expert this predictor is when ``from_pretrained`` is a release root (the folder as
    downloaded): ``high_noise`` reads ``high_noise_model/`` (official) or ``transformer/`` (``-Diffusers``),
    ``low_noise`` ``low_noise_model/`` or ``transformer_2/``; None for a one-DiT release (TI2V-5B) or a
    source that names the DiT's own folder. Not a ``WanDiTConfig`` field."""

    @model_validator(mode="after")
    def _heads_divide_dim(self) -> WanPredictorConfig:
        problems = []
        if min(self.patch_size) < 1:
            problems.append(Problem(("patch_size",), "expected 3 positive integers", self.patch_size))
        if {"dim", "num_heads"} <= self.model_fields_set:
            deps = (("dim",),)
            if self.dim % self.num_heads:
                problems.append(
                    Problem(("num_heads",), f"must divide dim ({self.dim})", self.num_heads, deps=deps)
                )
            elif (self.dim // self.num_heads) % 2:
                problems.append(
                    Problem(
                        ("num_heads",), "dim / num_heads must be even for RoPE", self.num_heads, deps=deps
                    )
                )
        if problems:
            raise RuleViolations(problems)
        return self


_UMT5Keywords = keyword_schema(
    "_UMT5Keywords",
    {
        "vocab_size": int,
        "d_model": int,
        "d_kv": int,
        "d_ff": int,
        "num_layers": int,
        "num_decoder_layers": int | None,
        "num_heads": int,
        "relative_attention_num_buckets": int,
        "relative_attention_max_distance": int,
        "dropout_rate": float,
        "layer_norm_epsilon": float,
        "initializer_factor": float,
        "feed_forward_proj": str,
        "is_encoder_decoder": bool,
        "use_cache": bool,
        "pad_token_id": int | None,
        "eos_token_id": int | list[int] | None,
        "decoder_start_token_id": int | None,
        "classifier_dropout": float,
    },
    "transformers.UMT5Config",
)


class UMT5EncoderConfig(_UMT5Keywords):
    """``config`` of ``umt5``: the tokenizer, the padded prompt length, and ``UMT5Config`` keywords
    (over the source's ``config.json``, or the whole shape without one)."""

    tokenizer: InputPath | None = None
    """Tokenizer folder; None = ``from_pretrained``."""
    text_len: int = Field(default=512, ge=1)
    """Tokens every prompt is padded (or cut) to."""


WanVAEConfig = keyword_schema(
    "WanVAEConfig",
    {
        "base_dim": int,
        "decoder_base_dim": int | None,
        "z_dim": int,
        "dim_mult": list[int],
        "num_res_blocks": int,
        "attn_scales": list[float],
        "temperal_downsample": list[bool],
        "dropout": float,
        "latents_mean": list[float] | None,
        "latents_std": list[float] | None,
        "is_residual": bool,
        "in_channels": int,
        "out_channels": int,
        "patch_size": int | None,
        "scale_factor_temporal": int | None,
        "scale_factor_spatial": int | None,
    },
    "diffusers.AutoencoderKLWan",
)

TRAIN_TIME_KEYS = ("caption_dropout", "seed")
"""``video_text`` keys drawn at train time: in the cache's ``data.dataset``, not in ``preprocess.clips``."""


class WanPreprocessOptions(ConfigModel):
    """``data.dataset.preprocess``: what ``wan22-train preprocess`` encodes into ``data.data_path``.

    The clips are read as ``video_text`` reads them (``clips``: the same keys, buckets included) and
    encoded by the very sub-models an online run would load (``ae``, ``text_encoder``: the same keys as
    under ``model.models``), through the run's own pipeline (``model.pipeline.task`` decides whether
    first-frame ``image_latents`` are cached too).
    """

    source: InputPath
    """Clip metadata file (``mm_data.VideoTextDataset`` layout: path, cap, fps, ...), or a caption folder
    (clips with a same-named ``.txt`` caption each)."""
    source_root: InputPath | None = None
    """Directory that relative clip paths are resolved against."""
    clips: VideoTextDatasetConfig
    """How clips are read (``video_text``'s keys); ``frame_offset`` start or center (one window per clip),
    ``caption_dropout`` / ``seed`` belong to the cache's ``data.dataset`` (drawn at train time)."""
    ae: SubModelConfig
    """The Wan VAE (``model_id: wan_video_vae``, ``from_pretrained``, ``dtype``)."""
    text_encoder: SubModelConfig
    """UMT5 (``model_id: umt5``, ``from_pretrained``, ``dtype``, ``config.tokenizer`` / ``text_len``)."""
    device: str | None = Field(default=None, pattern=r"^(cpu|cuda|npu)(:\d+)?$")
    """Encoder device; None = this rank's accelerator (``LOCAL_RANK``), else cpu."""
    run: PreprocessRunConfig = PreprocessRunConfig()
    """How the preprocess runs: shard size, decode workers, UMT5 sharding (FSDP2), VAE tiling."""

    @model_validator(mode="after")
    def _one_window_per_clip(self) -> WanPreprocessOptions:
        problems = []
        if self.clips.frame_offset == "random":
            why = (
                "a cache holds one window per clip: expected start or center (random would freeze epoch 0's)"
            )
            problems.append(Problem(("clips", "frame_offset"), why, self.clips.frame_offset))
        for key in TRAIN_TIME_KEYS:
            if key in self.clips.model_fields_set:
                why = f"drawn at train time from the cache: set data.dataset.{key} instead"
                problems.append(Problem(("clips", key), why, getattr(self.clips, key)))
        if problems:
            raise RuleViolations(problems)
        return self


class WanCachedSchema(ConfigModel):
    """``data.dataset`` of ``wan22_cached``: the encoder cache in ``data.data_path``
    (``mm_data.CachedVideoTextDataset``), with the caption draw of ``video_text`` at train time."""

    needs_data_path: ClassVar[bool] = True
    reads_data_root: ClassVar[bool] = False
    one_source_keys: ClassVar[dict[str, str]] = {
        "preprocess": "describes the one cache of data.data_path, which wan22-train preprocess writes and a run checks; "
        "preprocess each source with its own data.data_path and leave the section out of the run"
    }

    seed: int = Field(default=0, ge=0)
    """Seed of the per-sample caption draw (``video_text``'s ``seed``: the same prompts as online)."""
    caption_dropout: float = Field(default=0.0, ge=0, le=1)
    """Probability of the empty prompt (its embeddings are cached with every sample)."""
    max_bad_fraction: float = Field(default=0.05, ge=0, le=1)
    """Stop when more than this fraction of the samples could not be read at encode time."""
    preprocess: dict[str, Any] | None = None
    """Inputs of ``wan22-train preprocess`` (:class:`WanPreprocessOptions`); training ignores them and does
    not require their paths to exist."""

    @field_validator("preprocess")
    @classmethod
    def _preprocess_options(cls, value: dict[str, Any] | None, info: ValidationInfo) -> dict[str, Any] | None:
        if value is None:
            return None
        context = {**(info.context or {}), "check_paths": False}
        validate_plugin_dict(WanPreprocessOptions, value, context)
        return value  # as written: the preprocess tells the keys the user set from the defaults


register_pipeline_schema("wan2_2_container", WanPipelineOptions)
register_model_schema("wan2_2_predictor", WanPredictorConfig)
register_model_schema("umt5", UMT5EncoderConfig)
register_model_schema("wan_video_vae", WanVAEConfig)
register_dataset_schema("wan22_cached", WanCachedSchema)
declare_ids("container", "wan2_2_container")  # the other ids have schemas (known through them)

__all__ = [
    "EXPERTS",
    "Expert",
    "SCHEDULER_KEYS",
    "DistillOptions",
    "DPOOptions",
    "TASKS",
    "Task",
    "TRAIN_TIME_KEYS",
    "UMT5EncoderConfig",
    "WanCachedSchema",
    "WanPipelineOptions",
    "WanPredictorConfig",
    "WanPreprocessOptions",
    "WanVAEConfig",
]
