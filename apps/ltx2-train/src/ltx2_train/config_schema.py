"""The LTX-2 YAML keys, checked by ``mm-config check`` before anything is built.

Imports only pydantic and mm-config (no torch), so it is installed as the ``mm_config.schemas``
entry point ``ltx2`` and runs on a login node. It registers the schemas of ``model.pipeline`` and
``model.config`` of the single-model id ``ltx2_predictor``, of ``model.pipeline`` of the container
``ltx2_container`` (a distillation: ``distill``), and of ``data.dataset`` of ``ltx2_precomputed``. The pipeline option names below are the pipeline's own (``LTX2Pipeline``
imports them), so the schema and the code that reads the keys cannot drift apart.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, get_args

from mm_config import (
    ConfigModel,
    DistillOptions,
    DType,
    GRPOOptions,
    NFTOptions,
    PartialConfigModel,
    PreprocessRunConfig,
    Problem,
    RuleViolations,
    declare_ids,
    frame_rule_problem,
    keyword_schema,
    register_dataset_schema,
    register_model_schema,
    register_pipeline_schema,
)
from pydantic import Field, model_validator

TimestepSampling = Literal["shifted_logit_normal", "uniform"]
SAMPLING_MODES: tuple[str, ...] = get_args(TimestepSampling)
SAMPLER_KEYS = {
    "timestep_sampling": "mode",
    "sigma_std": "std",
    "shift_min_tokens": "min_tokens",
    "shift_min": "min_shift",
    "shift_max_tokens": "max_tokens",
    "shift_max": "max_shift",
}
"""``model.pipeline`` keys of the sigma sampler -> ``SigmaSampler`` fields."""
AudioTimesteps = Literal["shared", "independent"]
FrozenModality = Literal["none", "audio", "video"]
MissingAudio = Literal["refuse", "silence", "tone"]
ConditionModality = Literal["none", "audio", "video"]
Reference = Literal["none", "video", "audio", "audio_video"]
PIPELINE_KEYS = (
    "audio",
    "audio_timesteps",
    "frozen_modality",
    "condition_modality",
    "reference",
    "first_frame_conditioning_p",
    "conditioning_frames",
    "audio_conditioning_frames",
    "audio_loss_weight",
    "frame_rate",
    "audio_placeholder_tokens",
)
"""``model.pipeline`` keys passed to ``LTX2Pipeline(...)``."""


def conditioning_problems(options: dict) -> list[tuple[str, str, tuple[str, ...]]]:
    """``(key, why, keys it depends on)`` for each combination of the conditioning keys of ``model.pipeline``
    (``options``: the keys with their defaults) that cannot train or would not act; the pipeline and the
    schema both refuse them (one list, so the two cannot disagree)."""
    audio, cond, frozen = options["audio"], options["condition_modality"], options["frozen_modality"]
    out = []
    if not audio:
        needs = "needs the audio stream (audio: true)"
        if cond != "none":
            out.append(("condition_modality", f"{needs}: expected none without it", ("audio",)))
        if options["reference"] in ("audio", "audio_video"):
            out.append(("reference", f"{needs}: expected none or video without it", ("audio",)))
        if options["audio_conditioning_frames"]:
            out.append(("audio_conditioning_frames", f"{needs}: expected 0 without it", ("audio",)))
    if cond != "none" and frozen not in ("none", cond):
        why = f"leaves nothing to train: the {cond} is the condition and the {frozen} branch is frozen"
        out.append(("condition_modality", why, ("frozen_modality",)))
    if cond != "none" and options["audio_timesteps"] != "shared":
        why = "gives the conditioning stream timestep 0, so no second sigma is drawn: expected shared"
        out.append(("audio_timesteps", why, ("condition_modality",)))
    if cond == "video" and options["first_frame_conditioning_p"] > 0:
        why = "the whole video is the condition already (condition_modality: video): expected 0"
        out.append(("first_frame_conditioning_p", why, ("condition_modality",)))
    if cond == "audio" and options["audio_conditioning_frames"] > 0:
        why = "the whole audio is the condition already (condition_modality: audio): expected 0"
        out.append(("audio_conditioning_frames", why, ("condition_modality",)))
    return out


class LTX2PipelineOptions(PartialConfigModel):
    """``model.pipeline`` of ``ltx2_predictor`` (``LTX2Pipeline.from_options``)."""

    timestep_sampling: TimestepSampling = "shifted_logit_normal"
    """Sigma distribution: logit-normal shifted by the token count, or uniform."""
    sigma_std: float = Field(default=1.0, gt=0)
    """Standard deviation of the logit-normal."""
    shift_min_tokens: int = Field(default=1024, ge=1)
    """Token count of the first shift anchor."""
    shift_min: float = 0.95
    """Logit-normal mean at ``shift_min_tokens``."""
    shift_max_tokens: int = Field(default=4096, ge=1)
    """Token count of the second shift anchor."""
    shift_max: float = 2.05
    """Logit-normal mean at ``shift_max_tokens``."""
    audio: bool = True
    """Train the audio stream too (false: the T2V recipe, audio contributes no loss)."""
    audio_timesteps: AudioTimesteps = "shared"
    """The audio's sigma: ``shared``, the video's sigma of the same sample (one noise level for both
    streams); ``independent``, a second draw from the same sampler (same distribution, at the video token
    count) keyed apart (purpose ``audio_sigma``), so a sample's audio and video sit at different noise levels."""
    frozen_modality: FrozenModality = "none"
    """A modality whose branch does not train: ``audio`` trains video with the audio branch frozen (its
    parameters out of the optimizer, no audio loss; the audio tokens still run, noised, as context);
    ``video`` the reverse, audio-only training (T2A: no video loss). Refused with LoRA (whose adapters
    decide what trains) and, for ``video``, without ``audio``."""
    condition_modality: ConditionModality = "none"
    """A modality given clean as the other's condition: ``audio`` (A2V: the audio tokens at timestep 0, not
    noised, no audio loss; the video is generated) or ``video`` (V2A, the reverse). Unlike
    ``frozen_modality`` it freezes no weight: it changes what the stream is (context, not a target)."""
    reference: Reference = "none"
    """IC-LoRA: the reference clip's tokens placed in the sequence as context (clean, timestep 0, no loss),
    after the target's tokens, at the RoPE positions of a clip of their own shape from time 0 (diffusers'
    IC-LoRA pipeline): ``video`` (the cache's ``reference_latents``), ``audio``
    (``reference_audio_latents``) or ``audio_video`` (both). The cache comes from a metadata file whose rows
    name a ``reference`` clip (``ltx2-train preprocess``)."""
    first_frame_conditioning_p: float = Field(default=0.0, ge=0, le=1)
    """Probability that a sample is conditioned: its first ``conditioning_frames`` latent frames given clean."""
    conditioning_frames: int = Field(default=1, ge=1)
    """Latent frames a conditioned sample gets clean (timestep 0, no loss): 1 = the first frame (I2V / I2AV);
    K > 1 = video extension, continuing the first K latent frames (with ``first_frame_conditioning_p: 1``
    every sample). A clip needs more latent frames than K; the transformer's ``patch_size_t`` must be 1."""
    audio_conditioning_frames: int = Field(default=0, ge=0)
    """Audio extension: every sample's first K audio latent frames given clean (timestep 0, no loss); the
    audio continues them. 0: off. A clip needs more audio latent frames than K."""
    audio_loss_weight: float = Field(default=1.0, ge=0)
    """Weight of the audio MSE in the loss."""
    frame_rate: float = Field(default=24.0, gt=0)
    """Frame rate for RoPE when the batch carries none."""
    audio_placeholder_tokens: int = Field(default=8, ge=1)
    """Zero audio tokens fed when ``audio`` is false."""

    @model_validator(mode="after")
    def _conditioning_frames_need_conditioning(self) -> LTX2PipelineOptions:
        if self.conditioning_frames != 1 and self.first_frame_conditioning_p == 0:
            why = "conditions no sample while first_frame_conditioning_p is 0: set that > 0 (1: every sample)"
            deps = (("first_frame_conditioning_p",),)
            raise RuleViolations(
                [Problem(("conditioning_frames",), why, self.conditioning_frames, deps=deps)]
            )
        return self

    @model_validator(mode="after")
    def _audio_only_needs_audio(self) -> LTX2PipelineOptions:
        if self.frozen_modality == "video" and not self.audio:
            why = "audio-only training needs the audio stream: set audio: true, or frozen_modality: none"
            raise RuleViolations(
                [Problem(("frozen_modality",), why, self.frozen_modality, deps=(("audio",),))]
            )
        return self

    @model_validator(mode="after")
    def _conditions_agree(self) -> LTX2PipelineOptions:
        problems = [Problem((key,), why, getattr(self, key), deps=tuple((d,) for d in deps))
                    for key, why, deps in conditioning_problems(self.model_dump())]  # fmt: skip
        if problems:
            raise RuleViolations(problems)
        return self

    @model_validator(mode="after")
    def _anchors_differ(self) -> LTX2PipelineOptions:
        if self.shift_max_tokens == self.shift_min_tokens:
            message = "must differ from shift_min_tokens (the shift is a line through two anchors)"
            deps = (("shift_min_tokens",),)
            raise RuleViolations([Problem(("shift_max_tokens",), message, self.shift_max_tokens, deps=deps)])
        return self


def _no_guidance_problems(options: ConfigModel, keys: tuple[str, ...]) -> list[Problem]:
    """LTX-2 trains on cached text embeddings with no negative ones: ``guidance_scale`` stays 1 and the
    ``keys`` that only guidance or a text encoder would read are refused when set."""
    problems = []
    if getattr(options, "guidance_scale", 1.0) != 1.0:
        why = "LTX-2 trains on cached text embeddings, with no negative ones for guidance: expected 1"
        problems.append(Problem(("guidance_scale",), why, options.guidance_scale))
    for key in keys:
        if key in options.model_fields_set:
            why = "no text encoder runs in LTX-2 training (no negative prompt to encode): remove it"
            problems.append(Problem((key,), why, getattr(options, key)))
    return problems


class LTX2DistillOptions(DistillOptions):
    """``model.pipeline.distill`` of ``ltx2_container``: DMD2 of the frozen ``teacher`` into the student
    ``model``, with the fake-score ``critic``, on the video and audio streams together. LTX-2 trains on
    cached text embeddings (with no negative ones) and its validation clips are the student's alone (no
    teacher reference is drawn), so the teacher's guidance stays 1 and the keys of the unconditional
    prompt and the validation reference are refused."""

    shift: float = Field(gt=0)
    """Time shift of the distillation's sigma grid: where its timesteps lie, and the student's schedule
    unless ``student_shift`` is set. ``ltx2-train sample`` of the teacher uses ``exp(mu)``, ``mu`` the
    sampler's shift at the clip's video token count (``exp(0.95) = 2.6`` at 1024 tokens, ``exp(2.05) = 7.8``
    at 4096): that of the clips distilled on is the natural choice."""

    @model_validator(mode="after")
    def _no_guidance_without_negative_embeddings(self) -> LTX2DistillOptions:
        problems = _no_guidance_problems(self, ("negative_prompt",))
        if "teacher_steps" in self.model_fields_set:
            why = (
                "LTX-2 validation samples the student's clips only, with no teacher reference to compare them "
                "with: remove it"
            )
            problems.append(Problem(("teacher_steps",), why, self.teacher_steps))
        if problems:
            raise RuleViolations(problems)
        return self


class LTX2GRPOOptions(GRPOOptions):
    """``model.pipeline.grpo`` of ``ltx2_container``: Flow-GRPO of the policy ``model`` (full or LoRA) on its
    own SDE rollouts of both streams (video and audio), scored by ``training.rewards`` on the video. LTX-2
    has no negative text embeddings, so the rollouts are unguided (``guidance_scale`` 1)."""

    shift: float = Field(gt=0)  # type: ignore[assignment]
    """Time shift of the rollouts' sigma schedule (required: LTX-2 training has no sigma grid of its own;
    ``exp(mu)`` of the clips' video token count, as ``ltx2-train sample`` uses, is the natural choice)."""

    @model_validator(mode="after")
    def _no_guidance(self) -> LTX2GRPOOptions:
        problems = _no_guidance_problems(self, ("negative_prompt",))
        if problems:
            raise RuleViolations(problems)
        return self


class LTX2NFTOptions(NFTOptions):
    """``model.pipeline.nft`` of ``ltx2_container``: DiffusionNFT of the policy ``model`` on its old policy's
    ODE rollouts of both streams, scored by ``training.rewards`` on the video."""

    shift: float = Field(gt=0)  # type: ignore[assignment]
    """Time shift of the rollouts' sigma schedule (required, as ``grpo.shift``)."""


#: The training modes of ``ltx2_container`` beside ordinary training: ``model.pipeline`` keys.
CONTAINER_MODES = ("distill", "grpo", "nft")
#: What a distillation or a reward fine-tuning (each draws whole clips of both streams from noise at one
#: sigma per sample and trains the whole policy) cannot use: ``(key, its default, why)``.
WHOLE_CLIP_KEYS = (
    ("audio_timesteps", "shared", "moves both streams at one sigma per sample"),
    ("frozen_modality", "none", "trains both streams of the whole transformer"),
    ("condition_modality", "none", "draws both streams from noise"),
    ("reference", "none", "draws no reference clip"),
    ("audio_conditioning_frames", 0, "draws whole clips (no clean frames)"),
    ("first_frame_conditioning_p", 0.0, "draws whole clips (no clean conditioning frames)"),
)


def whole_clip_problems(options: Any) -> list[tuple[str, Any, str]]:
    """``(key, its default, why)`` of each :data:`WHOLE_CLIP_KEYS` whose value on ``options`` (the pipeline
    options, or an ``LTX2Pipeline``: the same attribute names) is not its default."""
    return [(key, default, why) for key, default, why in WHOLE_CLIP_KEYS if getattr(options, key) != default]


class LTX2ContainerPipelineOptions(LTX2PipelineOptions):
    """``model.pipeline`` of ``ltx2_container`` (``LTX2Container.build_pipeline``): the LTX-2 pipeline
    options and one training mode at most: few-step distillation (``distill``), Flow-GRPO (``grpo``) or
    DiffusionNFT (``nft``)."""

    distill: LTX2DistillOptions | None = None
    """Few-step distillation (DMD2) of the ``teacher`` into the student ``model``; None: ordinary training."""
    grpo: LTX2GRPOOptions | None = None
    """Flow-GRPO of the policy ``model`` on its SDE rollouts (video and audio) scored by ``training.rewards``,
    in the phase ``grpo``; None: ordinary training."""
    nft: LTX2NFTOptions | None = None
    """DiffusionNFT of the policy ``model`` on its old policy's ODE rollouts (video and audio) scored by
    ``training.rewards``, in the phase ``nft``; None: ordinary training."""

    @model_validator(mode="after")
    def _what_a_mode_does_not_use(self) -> LTX2ContainerPipelineOptions:
        modes = [m for m in CONTAINER_MODES if getattr(self, m) is not None]
        if not modes:
            return self
        mode, deps = modes[0], ((modes[0],),)
        what = "a distillation" if mode == "distill" else f"{mode} (a reward fine-tuning)"
        problems = [
            Problem((other,), f"one training mode at a time: not with {mode}", deps=deps)
            for other in modes[1:]
        ]
        problems += [
            Problem((key,), f"{what} draws its sigmas on the grid of {mode}.shift: remove it", deps=deps)
            for key in SAMPLER_KEYS
            if key in self.model_fields_set
        ]
        problems += [
            Problem((key,), f"{what} {why}: expected {default}", getattr(self, key), deps=deps)
            for key, default, why in whole_clip_problems(self)
        ]
        if problems:
            raise RuleViolations(problems)
        return self


LTX2PredictorConfig = keyword_schema(
    "LTX2PredictorConfig",
    {
        **dict.fromkeys(
            (
                "in_channels", "patch_size", "patch_size_t", "num_attention_heads", "attention_head_dim",
                "cross_attention_dim", "pos_embed_max_pos", "base_height", "base_width", "audio_in_channels",
                "audio_patch_size", "audio_patch_size_t", "audio_num_attention_heads", "audio_attention_head_dim",
                "audio_cross_attention_dim", "audio_scale_factor", "audio_pos_embed_max_pos",
                "audio_sampling_rate", "audio_hop_length", "num_layers", "caption_channels", "causal_offset",
                "timestep_scale_multiplier", "cross_attn_timestep_scale_multiplier",
            ),
            int,
        ),
        **dict.fromkeys(("out_channels", "audio_out_channels"), int | None),
        **dict.fromkeys(
            (
                "gated_attn", "cross_attn_mod", "audio_gated_attn", "audio_cross_attn_mod",
                "norm_elementwise_affine", "attention_bias", "attention_out_bias", "rope_double_precision",
                "use_prompt_embeddings", "perturbed_attn", "ff_bias", "audio_ff_bias",
                "use_prompt_adaln_single", "use_keyframes_abs_pos_embedding",
            ),
            bool,
        ),
        **dict.fromkeys(("activation_fn", "qk_norm", "rope_type"), str),
        **dict.fromkeys(("norm_eps", "rope_theta"), float),
        "vae_scale_factors": list[int],
    },
    "diffusers.LTX2VideoTransformer3DModel",
)  # fmt: skip


class PreprocessOptions(ConfigModel):
    """``data.dataset.preprocess``: what ``ltx2-train preprocess`` encodes into ``data.data_path``.

    Its paths are not required to exist by the training check: training reads only the cache.
    """

    source: str
    """Clip metadata file (``mm_data.VideoTextDataset`` layout: path, cap, fps, ...), or a caption folder
    (clips with a same-named ``.txt`` caption each)."""
    source_root: str | None = None
    """Directory that relative clip paths of a metadata file are resolved against."""
    model_root: str
    """LTX-2 diffusers folder with ``vae/``, ``audio_vae/``, ``text_encoder/``, ``tokenizer/``, ``connectors/``."""
    release_file: str | None = None
    """An official LTX-2 release file (one ``.safetensors`` holding transformer, VAEs, vocoder and connectors):
    the video VAE, audio VAE and text connectors are read from it (``ltx2_train.release_file``), ``model_root``
    giving ``text_encoder/``, ``tokenizer/`` and those components' ``config.json``; None: all from
    ``model_root``."""
    num_frames: int = Field(default=121, ge=1)
    """Frames per clip (8k+1 for LTX-2's x8 temporal VAE)."""
    height: int = Field(default=512, ge=1)
    """Frame height in pixels (multiple of the VAE's spatial factor)."""
    width: int = Field(default=768, ge=1)
    """Frame width in pixels."""
    fps: float | None = Field(default=None, gt=0)
    """Resample clips to this frame rate; None keeps each clip's own rate."""
    frame_rule: str | None = None
    """Frame-count rule checked by the clip reader (e.g. ``8k+1``); None = any."""
    max_sequence_length: int = Field(default=1024, ge=1)
    """Text tokens (padded, left) fed to Gemma-3."""
    audio: bool = True
    """Encode audio latents too (a clip without an audio track: ``missing_audio``)."""
    missing_audio: MissingAudio = "refuse"
    """A clip without an audio track in a source with ``audio``: ``refuse`` (before any encoder loads,
    naming each clip; exit 66), ``silence`` (its audio is a silent waveform, zeros, encoded as any clip's)
    or ``tone`` (a stand-in sine whose pitch follows the clip's content: for synthetic test clips, such
    as ``make-tiny``'s silent ones, where each clip should still have a sound of its own). ``preprocess``'s
    report names the clips given silence or a tone."""
    dtype: DType = "fp32"
    """Encoder compute dtype (fp32 | bf16 | fp16); cached tensors keep it."""
    device: str | None = Field(default=None, pattern=r"^(cpu|cuda|npu)(:\d+)?$")
    """Encoder device; None = this rank's accelerator (``LOCAL_RANK``), else cpu."""
    frame_offset: Literal["start", "center"] = "start"
    """Where in each clip the cached frames start (a cache holds one window per clip)."""
    run: PreprocessRunConfig = PreprocessRunConfig()
    """How the preprocess runs: shard size, decode workers, Gemma-3 sharding (FSDP2), VAE tiling."""

    @model_validator(mode="after")
    def _frames_follow_the_rule(self) -> PreprocessOptions:
        why = frame_rule_problem(self.num_frames, self.frame_rule)
        if why is not None:
            raise RuleViolations([Problem(("num_frames",), why, self.num_frames, deps=(("frame_rule",),))])
        return self


class LTX2PrecomputedSchema(ConfigModel):
    """``data.dataset`` of ``ltx2_precomputed`` (the cache folder is ``data.data_path``)."""

    needs_data_path: ClassVar[bool] = True
    reads_data_root: ClassVar[bool] = False
    one_source_keys: ClassVar[dict[str, str]] = {
        "preprocess": "describes the one cache of data.data_path, which ltx2-train preprocess writes and a run checks; "
        "preprocess each source with its own data.data_path and leave the section out of the run"
    }

    preprocess: PreprocessOptions | None = None
    """Inputs of ``ltx2-train preprocess``; ignored by training."""


register_pipeline_schema("ltx2_predictor", LTX2PipelineOptions)
register_model_schema("ltx2_predictor", LTX2PredictorConfig)
register_dataset_schema("ltx2_precomputed", LTX2PrecomputedSchema)
register_pipeline_schema("ltx2_container", LTX2ContainerPipelineOptions)
declare_ids("container", "ltx2_container")  # the other ids have schemas (known through them)

__all__ = [
    "PIPELINE_KEYS",
    "AudioTimesteps",
    "ConditionModality",
    "FrozenModality",
    "MissingAudio",
    "Reference",
    "conditioning_problems",
    "SAMPLER_KEYS",
    "SAMPLING_MODES",
    "LTX2ContainerPipelineOptions",
    "LTX2DistillOptions",
    "LTX2GRPOOptions",
    "LTX2NFTOptions",
    "LTX2PipelineOptions",
    "LTX2PrecomputedSchema",
    "LTX2PredictorConfig",
    "PreprocessOptions",
    "TimestepSampling",
    "WHOLE_CLIP_KEYS",
    "whole_clip_problems",
]
