"""``parallel``: world layout (FSDP shard/replicate, Ulysses x Ring context parallel) and the FSDP2 plan.

The FSDP plan sections mirror ``mm_parallel.FSDPPlan`` / ``SubPlan`` field for field (same
defaults, same accepted values; mm-trainer's ``fsdp_plan_from_config`` converts, and its parity test
keeps the two equal).

Mesh layout (outer to inner): ``dp_replicate x dp_shard x cp`` with ``cp = ulysses x ring``.
FSDP shards parameters over ``dp_shard x cp`` (context-parallel ranks hold different tokens of
the same samples, so they can share parameter shards), so
``fully_shard_parallel_size = world_size / replicate_parallel_size``; the data-parallel size seen by
the sampler is ``world_size / cp`` (all ranks of a CP group read the same sample).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, field_validator

from .base import ConfigModel, DType, ModulePattern


def _auto_or_int(value: Any) -> Any:
    if value == "auto" or value is None:
        return "auto"
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError("expected 'auto' or a positive integer")
    return value


AutoInt = Annotated[Literal["auto"] | int, BeforeValidator(_auto_or_int)]
#: Ring-attention block kernels (mm_parallel's registry; a test keeps the two lists equal).
AttentionBackendName = Literal["auto", "flash", "efficient", "flash_attn", "npu", "cpu_flash", "math"]


class SubPlanConfig(ConfigModel):
    """Per-sub-model override of the FSDP plan (``parallel.fsdp_plan.sub_plans.<sub-model>``)."""

    shard_size: int | None = Field(default=None, ge=1)
    """Ranks one copy of this sub-model is sharded over (HSDP: replicated world/shard_size times);
    None = the global ``fully_shard_parallel_size``."""
    reshard_after_forward: bool | None = None
    """Override of ``fsdp_plan.reshard_after_forward`` for this sub-model; None inherits."""
    cpu_offload: bool | None = None
    """Override of ``fsdp_plan.cpu_offload`` for this sub-model; None inherits."""
    enabled: bool = True
    """False: do not shard this sub-model at all (it stays whole on every rank)."""


class FSDPPlanConfig(ConfigModel):
    """Which modules ``fully_shard`` wraps and with which policies (``parallel.fsdp_plan``)."""

    apply_modules: list[ModulePattern] = []
    """Module path patterns wrapped as FSDP units, full-match over ``named_modules()``:
    ``{*}`` one integer segment, ``{a-b}`` inclusive range, ``*`` any characters, ``?`` one character."""
    ignored_modules: list[ModulePattern] = []
    """Module path patterns whose parameters FSDP never shards nor casts (e.g. ``ae``)."""
    param_dtype: DType = None
    """Compute dtype of unsharded parameters (MixedPrecisionPolicy); None keeps the stored dtype."""
    reduce_dtype: DType = None
    """Dtype of gradient reduce-scatter / all-reduce; None = param_dtype."""
    output_dtype: DType = None
    """Dtype forward outputs are cast to; None leaves them."""
    cast_forward_inputs: bool = True
    """Cast floating-point forward inputs to ``param_dtype``."""
    reshard_after_forward: bool = True
    """Free the unsharded parameters after forward (re-gathered in backward): less memory, more comm."""
    cpu_offload: bool = False
    """Keep sharded parameters, gradients and optimizer state on the host (CPUOffloadPolicy)."""
    num_to_forward_prefetch: int = Field(default=0, ge=0)
    """How many following units of the same sub-model to all-gather ahead in forward (explicit
    prefetch); 0 leaves FSDP2's implicit prefetching alone."""
    num_to_backward_prefetch: int = Field(default=0, ge=0)
    """How many preceding units of the same sub-model to all-gather ahead in backward (explicit
    prefetch); 0 leaves FSDP2's implicit prefetching alone."""
    cross_submodel_prefetch: list[Annotated[str, Field(min_length=1)]] = []
    """Sub-models in the order the pipeline runs them every micro-step (``[text_encoder, predictor]``):
    each one's last FSDP unit starts the all-gather of the next one's first unit, so the next
    sub-model's parameters arrive while the current one computes (from the second step on)."""
    sub_plans: dict[str, SubPlanConfig] = {}
    """Per-sub-model overrides keyed by sub-model name (``text_encoder: {shard_size: 4}``)."""

    @field_validator("cross_submodel_prefetch")
    @classmethod
    def _each_sub_model_once(cls, order: list[str]) -> list[str]:
        if len(set(order)) != len(order):
            raise ValueError("names a sub-model twice")
        return order


def _overlap_shorthand(value: Any) -> Any:
    if value == "auto" or value is None:
        return {}
    if value is False or value == "off":  # YAML reads a bare off as false
        return {"projections": False, "head_groups": 1}
    if not isinstance(value, (dict, UlyssesOverlapConfig)):
        raise ValueError("expected auto, off, or {projections: ..., head_groups: ...}")
    return value


def _auto_or_bool(value: Any) -> Any:
    if value == "auto" or value is None:
        return "auto"
    if not isinstance(value, bool):
        raise ValueError("expected 'auto', true or false")
    return value


class UlyssesOverlapConfig(ConfigModel):
    """How the Ulysses all-to-alls overlap compute (``parallel.ulysses_overlap``; mm-parallel's
    ``UlyssesOverlap``, :mod:`mm_parallel.ulysses`). Either knob changes time only: the results are
    bitwise those without overlap. The section may be written ``auto`` (both ``auto``) or ``off`` (no
    overlap)."""

    projections: Annotated[Literal["auto"] | bool, BeforeValidator(_auto_or_bool)] = "auto"
    """``true``: each of q, k, v is projected (with its per-token norm and RoPE) while the previous one's
    all-to-all is in flight; ``false``: the three are projected, then sent. ``auto`` = the device's measured
    default (``mm_parallel.ulysses.OVERLAP_PROJECTIONS_DEFAULT``: cpu off, no measured gain on the CPU,
    benchmarks/README.md; cuda / npu off until ``benchmarks/device_check.sh`` measures them). Needs
    ``ulysses_parallel_size > 1``; with a ring, ``auto`` is off."""
    head_groups: AutoInt = "auto"
    """Head groups whose all-to-alls overlap the other groups' attention (1 = off); the trainable
    sub-models' heads must divide by ``head_groups x ulysses_parallel_size``. ``auto`` = the device's
    measured default where the heads divide (``mm_parallel.ulysses.OVERLAP_HEADS_DEFAULT``: cpu 2, cuda /
    npu 1). Above 1 needs ``ulysses_parallel_size > 1``; with a ring, ``auto`` is 1."""

    @property
    def chosen(self) -> bool:
        """Whether either knob is set to overlap (not ``auto``, not off)."""
        return self.projections is True or (self.head_groups != "auto" and int(self.head_groups) > 1)


class ParallelConfig(ConfigModel):
    """The ``parallel`` section. After validation every size is resolved to an integer."""

    fully_shard_parallel_size: AutoInt = "auto"
    """FSDP shard degree (``dp_shard x cp``); ``auto`` = world_size / replicate_parallel_size."""
    replicate_parallel_size: AutoInt = "auto"
    """Replicate degree (HSDP replicas of the sharded model; was ``data_parallel_size``, which the
    sampler's data-parallel size ``dp_size`` = world / cp is not); 1 = plain FSDP over every rank. ``auto`` =
    one replica per node: world / lcm(ranks per node, ulysses x ring), so plain FSDP on one node, and
    across nodes HSDP whose shard groups and context-parallel groups stay inside a node while only the
    gradient all-reduce crosses nodes. Ranks per node: ``$LOCAL_WORLD_SIZE`` (torchrun's
    ``--nproc-per-node``), else all ranks on one node. With an explicit ``fully_shard_parallel_size``,
    ``auto`` is world / that."""
    tensor_parallel_size: int = Field(default=1, ge=1)
    """Tensor parallel degree; only 1 is supported."""
    ulysses_parallel_size: int = Field(default=1, ge=1)
    """Ulysses context-parallel degree (all-to-all between sequence and heads)."""
    ring_attention_size: int = Field(default=1, ge=1)
    """Ring-attention context-parallel degree (KV blocks passed around a ring)."""
    attention_backend: AttentionBackendName = "auto"
    """Kernel of the ring-attention blocks (needs ring_attention_size > 1): ``auto`` = the device's fused
    kernel (``cpu_flash``, ``flash`` on CUDA, ``npu``); ``flash`` = torch's FlashAttention-2 kernel (its
    memory-efficient one for masked blocks and fp32), ``efficient`` = torch's memory-efficient kernel,
    ``flash_attn`` = the flash_attn package, ``npu`` = torch_npu's fusion attention, ``math`` = the fp32
    reference (materializes [B, H, Sq, Sk] scores). Logged once per run; an unavailable one is an error."""
    ulysses_overlap: Annotated[UlyssesOverlapConfig, BeforeValidator(_overlap_shorthand)] = (
        UlyssesOverlapConfig()
    )
    """How the Ulysses all-to-alls overlap compute: ``auto`` (the device's measured defaults), ``off``, or
    ``{projections: true|false|auto, head_groups: N|auto}`` (:class:`UlyssesOverlapConfig`)."""
    fsdp_plan: FSDPPlanConfig = FSDPPlanConfig()
    """The FSDP2 plan."""

    @field_validator("tensor_parallel_size")
    @classmethod
    def _tp_is_one(cls, value: int) -> int:
        if value != 1:
            raise ValueError("expected 1 (tensor parallelism is not supported)")
        return value

    @property
    def cp_size(self) -> int:
        """Context-parallel degree ``ulysses_parallel_size * ring_attention_size``."""
        return self.ulysses_parallel_size * self.ring_attention_size

    @property
    def world_size(self) -> int:
        """World size this section was resolved for (``replicate_parallel_size * fully_shard_parallel_size``)."""
        shard = self._resolved_shard()
        return int(self.replicate_parallel_size) * shard

    @property
    def dp_size(self) -> int:
        """Data-parallel size for the sampler: ``world_size / cp_size`` (a CP group reads one sample)."""
        return self.world_size // self.cp_size

    @property
    def dp_shard_size(self) -> int:
        """Data-parallel part of the FSDP shard group: ``fully_shard_parallel_size / cp_size``."""
        return self._resolved_shard() // self.cp_size

    def _resolved_shard(self) -> int:
        for key in ("fully_shard_parallel_size", "replicate_parallel_size"):
            if getattr(self, key) == "auto":
                raise ValueError(f"parallel.{key} is 'auto'; validate via TrainConfig to resolve it")
        return int(self.fully_shard_parallel_size)


__all__ = ["FSDPPlanConfig", "ParallelConfig", "SubPlanConfig", "UlyssesOverlapConfig"]
