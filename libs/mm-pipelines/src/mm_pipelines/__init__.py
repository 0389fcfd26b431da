"""Generative training pipelines: the pipeline base, keyed per-sample randomness, the flow-match scheduler,
T2V/I2V pipelines, distillation (DMD2), preference training (Diffusion-DPO), SDE / ODE rollouts and reward
fine-tuning (Flow-GRPO, DiffusionNFT)."""

from .conditioning import (
    as_tensor_output,
    first_frame_mask,
    first_frame_video,
    i2v_condition,
    masked_text_embeddings,
    replace_first_frame,
)
from .container import TrainabilityAware, call_role, get_submodule, is_trainable
from .diffusion_nft import WEIGHT_FLOOR, DiffusionNFT, nft_policy_loss, optimality_probability
from .distribution_matching import (
    DistributionMatchingDistillation,
    FlowState,
    check_distillation_models,
    distillation_architecture_problems,
    weighted_streams,
    with_distillation,
)
from .flow_grpo import (
    ADVANTAGE_EPS,
    FlowGRPO,
    SampleScorer,
    clipped_policy_loss,
    group_advantages,
    transition_kl,
)
from .flow_match_scheduler import (
    DEFAULT_SIGMA_MIN,
    FlowMatchScheduler,
    boundary_index,
    shift_sigmas,
)
from .flow_match_t2v import FlowMatchT2VPipeline
from .group_rollouts import (
    check_call,
    clip_prompts,
    group_noise,
    keyed_steps,
    repeat_conditions,
    rollout_sigmas,
    score_clips,
    scored_latents,
    stream_noise,
)
from .keyed_random import SampleRNG, key_seed
from .old_policy import OldPolicyEMA
from .pipeline_base import GenerativePipelineBase, PipelineOutput
from .preference import REFERENCE_ROLE, REJECTED_PREFIX, DiffusionDPO, as_reference, dpo_loss, split_pair
from .rollout import (
    Flow,
    Rollout,
    element_mean,
    ode_rollout,
    sde_coefficient,
    sde_rollout,
    sde_transition,
    state_transition,
    transition_log_prob,
)

__version__ = "0.1.0"

__all__ = [
    "ADVANTAGE_EPS",
    "DEFAULT_SIGMA_MIN",
    "FlowGRPO",
    "DiffusionNFT",
    "OldPolicyEMA",
    "WEIGHT_FLOOR",
    "nft_policy_loss",
    "optimality_probability",
    "ode_rollout",
    "check_call",
    "clip_prompts",
    "group_noise",
    "keyed_steps",
    "repeat_conditions",
    "rollout_sigmas",
    "score_clips",
    "scored_latents",
    "stream_noise",
    "Flow",
    "Rollout",
    "element_mean",
    "state_transition",
    "SampleScorer",
    "as_reference",
    "clipped_policy_loss",
    "group_advantages",
    "sde_coefficient",
    "sde_rollout",
    "sde_transition",
    "transition_kl",
    "transition_log_prob",
    "DistributionMatchingDistillation",
    "DiffusionDPO",
    "REFERENCE_ROLE",
    "REJECTED_PREFIX",
    "dpo_loss",
    "split_pair",
    "FlowState",
    "check_distillation_models",
    "distillation_architecture_problems",
    "weighted_streams",
    "with_distillation",
    "FlowMatchScheduler",
    "FlowMatchT2VPipeline",
    "GenerativePipelineBase",
    "PipelineOutput",
    "SampleRNG",
    "TrainabilityAware",
    "as_tensor_output",
    "boundary_index",
    "call_role",
    "first_frame_mask",
    "first_frame_video",
    "get_submodule",
    "i2v_condition",
    "is_trainable",
    "key_seed",
    "masked_text_embeddings",
    "replace_first_frame",
    "shift_sigmas",
]
