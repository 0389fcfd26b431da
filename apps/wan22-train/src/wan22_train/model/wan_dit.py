"""Native Wan2.x diffusion transformer (`WanDiT`) in the official Wan parameter layout.

Numerically interchangeable with diffusers' `WanTransformer3DModel` (same forward signature and
positional order); state-dict keys follow the official release (`self_attn.q`, `ffn.0`, `modulation`,
`head.head`, ...), mapped to diffusers by mm-checkpoint's `wan2_2` key map (`wan22_train.key_maps`).

Parallelism stays outside this file: self-attention goes through one seam, `WanDiT.attention_fn`
(q, k, v in [B, S, H, D] -> [B, S, H, D]; one marked `takes_projections` gets the q, k, v projections as
callables instead, to overlap its all-to-all with them: `mm_parallel.ulysses`), and
`enable_context_parallel` installs the callables that split the token sequence after patch embedding
(RoPE tables and per-token timesteps alike) and gather it before unpatchify. Cross-attention always
sees the full text. Weights on disk: `weights.py`.

A list of latents (different shapes) is a packed forward (`packing.py`): one token sequence, each sample
with its own timestep, RoPE grid and text, attention restricted to each sample; its split / attention
come from the packing seam `WanDiT.packing_fn` (one process by default).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from .config import WanDiTConfig
from .packing import PackingFn, one_process_ops, packed_forward
from .rope import apply_rope, rope_cos_sin

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class SequenceSplitFn(Protocol):
    """Returns this rank's slice of `x` along `dim` (it may pad; the attention function must then mask)."""

    def __call__(self, x: torch.Tensor, dim: int) -> torch.Tensor: ...


class SequenceGatherFn(Protocol):
    """Inverse of the split: the full tensor along `dim`, exactly `size` long (any padding removed)."""

    def __call__(self, x: torch.Tensor, dim: int, size: int) -> torch.Tensor: ...


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Plain non-causal attention on the [B, S, H, D] layout (PyTorch SDPA kernels)."""
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    return out.transpose(1, 2)


def timestep_sinusoid(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal timestep embedding [cos | sin] with periods up to 10000 (float32, as diffusers)."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    angles = t.float()[..., None] * freqs
    return torch.cat([angles.cos(), angles.sin()], dim=-1)


def _modulate(x: torch.Tensor, norm: Callable[[torch.Tensor], torch.Tensor], shift, scale) -> torch.Tensor:
    # fp32: norm(x) * (1 + scale) + shift, back in x's dtype
    return torch.addcmul(shift, norm(x.float()), 1 + scale).to(x.dtype)


def _gated_residual(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    # fp32: x + y * gate, back in x's dtype
    return torch.addcmul(x.float(), y.float(), gate).to(x.dtype)


class WanLayerNorm(nn.LayerNorm):
    """LayerNorm computed in fp32 whatever the input/parameter dtype (returns fp32)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = None if self.weight is None else self.weight.float()
        bias = None if self.bias is None else self.bias.float()
        return F.layer_norm(x.float(), self.normalized_shape, weight, bias, self.eps)


class WanAttention(nn.Module):
    """Multi-head attention with q/k RMSNorm over all heads; self-attention applies RoPE."""

    def __init__(self, dim: int, num_heads: int, qk_norm: bool, eps: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.o = nn.Linear(dim, dim)
        self.norm_q = nn.RMSNorm(dim, eps=eps) if qk_norm else nn.Identity()
        self.norm_k = nn.RMSNorm(dim, eps=eps) if qk_norm else nn.Identity()

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor | None = None,
        rope: tuple[torch.Tensor, torch.Tensor] | None = None,
        attention_fn: AttentionFn = sdpa_attention,
    ) -> torch.Tensor:
        """x: [B, S, dim]; context: [B, L, dim] for cross-attention (None = self); returns [B, S, dim]."""
        kv = x if context is None else context

        # q, k, v: B, S|L, H, D; q and k normalised over all heads, then rotated (per token, local tokens)
        def project_q() -> torch.Tensor:
            q = self.norm_q(self.q(x)).unflatten(-1, (self.num_heads, -1))
            return q if rope is None else apply_rope(q, *rope)

        def project_k() -> torch.Tensor:
            k = self.norm_k(self.k(kv)).unflatten(-1, (self.num_heads, -1))
            return k if rope is None else apply_rope(k, *rope)

        def project_v() -> torch.Tensor:
            return self.v(kv).unflatten(-1, (self.num_heads, -1))

        return self.o(_attend(attention_fn, project_q, project_k, project_v).flatten(2))


def _attend(attention_fn: AttentionFn, *projections: Callable[[], torch.Tensor]) -> torch.Tensor:
    """``attention_fn`` of the projected q, k, v; one marked ``takes_projections`` (mm_parallel's Ulysses
    attention) gets the projections themselves, so it can overlap its communication with them."""
    if getattr(attention_fn, "takes_projections", False):
        return attention_fn(*projections)
    return attention_fn(*(project() for project in projections))


class WanBlock(nn.Module):
    """Self-attention (RoPE) -> cross-attention over text -> FFN, with adaLN modulation from the timestep."""

    def __init__(self, config: WanDiTConfig) -> None:
        super().__init__()
        dim, eps = config.dim, config.eps
        self.norm1 = WanLayerNorm(dim, eps, elementwise_affine=False)
        self.self_attn = WanAttention(dim, config.num_heads, config.qk_norm, eps)
        self.norm3 = WanLayerNorm(dim, eps) if config.cross_attn_norm else nn.Identity()
        self.cross_attn = WanAttention(dim, config.num_heads, config.qk_norm, eps)
        self.norm2 = WanLayerNorm(dim, eps, elementwise_affine=False)
        self.ffn = nn.Sequential(
            nn.Linear(dim, config.ffn_dim), nn.GELU(approximate="tanh"), nn.Linear(config.ffn_dim, dim)
        )
        self.modulation = nn.Parameter(torch.randn(1, 6, dim) / dim**0.5)

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor,
        e: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        attention_fn: AttentionFn = sdpa_attention,
        cross_attention_fn: AttentionFn = sdpa_attention,
    ) -> torch.Tensor:
        """x: [B, S, dim]; context: [B, L, dim]; e: [B, 1|S, 6, dim] timestep projection.

        ``attention_fn`` runs the self-attention, ``cross_attention_fn`` the attention to the text (a
        packed forward restricts both to each sample)."""
        # mods: six of [B, 1|S, dim] in fp32
        shift, scale, gate, c_shift, c_scale, c_gate = (self.modulation.float() + e.float()).unbind(2)

        # 1. Self-attention
        y = self.self_attn(_modulate(x, self.norm1, shift, scale), rope=rope, attention_fn=attention_fn)
        x = _gated_residual(x, y, gate)

        # 2. Cross-attention (full text on every rank)
        x = x + self.cross_attn(self.norm3(x.float()).to(x.dtype), context, attention_fn=cross_attention_fn)

        # 3. Feed-forward
        y = self.ffn(_modulate(x, self.norm2, c_shift, c_scale))
        return _gated_residual(x, y, c_gate)


class WanHead(nn.Module):
    """Final modulated LayerNorm and projection to `out_dim * prod(patch_size)` per token."""

    def __init__(self, config: WanDiTConfig) -> None:
        super().__init__()
        self.norm = WanLayerNorm(config.dim, config.eps, elementwise_affine=False)
        self.head = nn.Linear(config.dim, config.out_dim * config.patch_volume)
        self.modulation = nn.Parameter(torch.randn(1, 2, config.dim) / config.dim**0.5)

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        """x: [B, S, dim]; temb: [B, 1|S, dim] time embedding; returns [B, S, out_dim * patch]."""
        shift, scale = (self.modulation.float() + temb.float().unsqueeze(2)).unbind(2)
        return self.head(_modulate(x, self.norm, shift, scale))


class WanDiT(nn.Module):
    """Wan2.x video DiT: `forward(hidden_states, timestep, encoder_hidden_states) -> velocity`."""

    def __init__(self, config: WanDiTConfig) -> None:
        super().__init__()
        self.config = config
        dim = config.dim
        self.patch_embedding = nn.Conv3d(config.in_dim, dim, config.patch_size, stride=config.patch_size)
        self.text_embedding = nn.Sequential(
            nn.Linear(config.text_dim, dim), nn.GELU(approximate="tanh"), nn.Linear(dim, dim)
        )
        self.time_embedding = nn.Sequential(nn.Linear(config.freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))
        self.blocks = nn.ModuleList(WanBlock(config) for _ in range(config.num_layers))
        self.head = WanHead(config)
        self.attention_fn: AttentionFn = sdpa_attention
        self._split_fn: SequenceSplitFn | None = None
        self._gather_fn: SequenceGatherFn | None = None
        #: the packed forward's split / attention per packing (``packing.context_parallel_ops`` under CP)
        self.packing_fn: PackingFn = one_process_ops

    @torch.no_grad()
    def init_weights(self) -> None:
        """Wan's random init (for training from scratch, or after `to_empty` from meta): xavier-uniform
        linears with zero bias, N(0, 0.02) condition embeddings, unit norms, zero output projection."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)
            elif isinstance(module, (nn.LayerNorm, nn.RMSNorm)) and module.weight is not None:
                nn.init.ones_(module.weight)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
        nn.init.xavier_uniform_(self.patch_embedding.weight.flatten(1))
        nn.init.zeros_(self.patch_embedding.bias)
        for seq in (self.text_embedding, self.time_embedding):
            for index in (0, 2):
                nn.init.normal_(seq[index].weight, std=0.02)
        for param in [block.modulation for block in self.blocks] + [self.head.modulation]:
            param.copy_(torch.randn_like(param) / self.config.dim**0.5)
        nn.init.zeros_(self.head.head.weight)

    # ---------------------------------------------------------------- seams
    def enable_context_parallel(
        self, split_fn: SequenceSplitFn, gather_fn: SequenceGatherFn, attention_fn: AttentionFn
    ) -> None:
        """Shard the token sequence: split after patch embedding, gather before unpatchify.

        Args:
            split_fn: `(x, dim) -> local slice`; applied to tokens [B, S, dim] (dim 1), RoPE tables
                [S, 1, D/2] (dim 0) and per-token timestep embeddings [B, S, ...] (dim 1).
            gather_fn: `(x, dim, size) -> full tensor` of the head output [B, S_local, C*p] (dim 1).
            attention_fn: self-attention over the sharded sequence (e.g. Ulysses/Ring), [B, S, H, D] layout.
        """
        self._split_fn, self._gather_fn, self.attention_fn = split_fn, gather_fn, attention_fn

    def disable_context_parallel(self) -> None:
        """Back to single-process attention over the whole sequence."""
        self._split_fn = self._gather_fn = None
        self.attention_fn = sdpa_attention
        self.packing_fn = one_process_ops

    @property
    def context_parallel_enabled(self) -> bool:
        """Whether `enable_context_parallel` hooks are installed."""
        return self._split_fn is not None

    # -------------------------------------------------------------- forward
    def _embed_time(self, timestep: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        # timestep: B or B, S -> temb: B, 1|S, dim ; e: B, 1|S, 6, dim
        t = timestep if timestep.ndim == 2 else timestep[:, None]
        sinusoid = timestep_sinusoid(t, self.config.freq_dim)
        temb = self.time_embedding(sinusoid.to(self.time_embedding[0].weight.dtype)).to(dtype)
        e = self.time_projection(temb).unflatten(-1, (6, -1))
        return temb, e

    def forward(
        self,
        hidden_states: torch.Tensor | Sequence[torch.Tensor],
        timestep: torch.Tensor | Sequence[torch.Tensor],
        encoder_hidden_states: torch.Tensor | Sequence[torch.Tensor],
    ) -> torch.Tensor | list[torch.Tensor]:
        """Predict the flow-matching velocity.

        Args:
            hidden_states: latents [B, in_dim, F, H, W] (F, H, W divisible by `patch_size`); or a list
                of per-sample latents [in_dim, F_i, H_i, W_i] of any shapes: a packed forward
                (:func:`wan22_train.model.packing.packed_forward`: each sample as if alone).
            timestep: [B], or [B, S] per post-patch token (TI2V first-frame conditioning); packed:
                [N], or per sample a scalar or its [S_i] per-token timesteps.
            encoder_hidden_states: text embeddings [B, L, text_dim]; packed: per sample [L_i, text_dim].

        Returns:
            [B, out_dim, F, H, W]; packed: per sample [out_dim, F_i, H_i, W_i].
        """
        if isinstance(hidden_states, (list, tuple)):
            return packed_forward(self, hidden_states, timestep, encoder_hidden_states, self.packing_fn)
        b, _, f, h, w = hidden_states.shape
        pt, ph, pw = self.config.patch_size
        if f % pt or h % ph or w % pw:
            raise ValueError(f"latent F, H, W = {(f, h, w)} must be divisible by patch_size {(pt, ph, pw)}")
        grid = (f // pt, h // ph, w // pw)
        seq_len = math.prod(grid)
        if timestep.ndim == 2 and timestep.shape[1] != seq_len:
            raise ValueError(f"per-token timestep has {timestep.shape[1]} tokens, latents have {seq_len}")

        # 1. Patch, RoPE tables (once for all blocks), conditions
        x = self.patch_embedding(hidden_states).flatten(2).transpose(1, 2).contiguous()  # x: B, S, dim
        rope = rope_cos_sin(
            grid,
            self.config.head_dim,
            theta=self.config.rope_theta,
            max_seq_len=self.config.rope_max_seq_len,
            device=x.device,
        )
        temb, e = self._embed_time(timestep, encoder_hidden_states.dtype)
        context = self.text_embedding(encoder_hidden_states)  # context: B, L, dim

        # 2. Sequence split (context parallel)
        if self._split_fn is not None:
            x = self._split_fn(x, 1)
            rope = (self._split_fn(rope[0], 0), self._split_fn(rope[1], 0))
            if timestep.ndim == 2:
                temb, e = self._split_fn(temb, 1), self._split_fn(e, 1)

        # 3. Transformer blocks
        for block in self.blocks:
            x = block(x, context, e, rope, self.attention_fn)

        # 4. Head, gather, unpatchify
        x = self.head(x, temb)  # x: B, S_local, out_dim * patch
        if self._gather_fn is not None:
            x = self._gather_fn(x, 1, seq_len)
        x = x.reshape(b, *grid, pt, ph, pw, self.config.out_dim)
        x = x.permute(0, 7, 1, 4, 2, 5, 3, 6)  # x: B, C, f, pt, h, ph, w, pw
        x = x.reshape(b, self.config.out_dim, f, h, w)
        # A one-token grid reshapes without a copy; return a tensor of its own, not a view of the head's
        # output (FSDP2 warns on a module that returns a view: an in-place op on it skips its hook).
        return x.clone() if x._is_view() else x
