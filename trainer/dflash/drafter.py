"""The DFlash drafter: KV injection of the target's features into a few Qwen3-style decoder layers.

Per layer, Q comes from the block only; K and V come from ``[context features ; block]`` through the
same W_k / W_v (k_norm on K). RoPE uses absolute positions: context 0..S-1, block a..a+B-1. The
context features (fc + RMSNorm over the concatenated target layers) never go through Q, O or the MLP.
Embeddings and lm_head are the target's, frozen and shared (excluded from checkpoints and export).
"""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from trainer.dflash.arch import (  # noqa: F401  (re-exported: the drafter's resolved architecture)
    SPECFORGE_HEAD_DIM,
    SPECFORGE_HEADS,
    SPECFORGE_KV_HEADS,
    DrafterArch,
    default_attention_shape,
    resolve_arch,
)
from trainer.dflash.config import DrafterConfig
from trainer.dflash.masks import AttentionMasks, attend

SHARED_PREFIXES = ("embed_tokens.", "lm_head.")


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * xf).to(x.dtype)  # output keeps the input dtype (bf16 under autocast)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [bs, L, head_dim] for integer positions [bs, L] (rotate-half convention)."""
    idx = torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32)
    inv = 1.0 / (theta ** (idx / head_dim))
    freqs = positions.float()[..., None] * inv
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [bs, h, L, d]; cos/sin [bs, L, d]."""
    cos, sin = cos[:, None].to(x.dtype), sin[:, None].to(x.dtype)
    return x * cos + _rotate_half(x) * sin


class DFlashAttention(nn.Module):
    def __init__(self, a: DrafterArch) -> None:
        super().__init__()
        self.h, self.hkv, self.d = a.num_attention_heads, a.num_key_value_heads, a.head_dim
        self.q_proj = nn.Linear(a.hidden_size, self.h * self.d, bias=False)
        self.k_proj = nn.Linear(a.hidden_size, self.hkv * self.d, bias=False)
        self.v_proj = nn.Linear(a.hidden_size, self.hkv * self.d, bias=False)
        self.o_proj = nn.Linear(self.h * self.d, a.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.d, a.rms_norm_eps)
        self.k_norm = RMSNorm(self.d, a.rms_norm_eps)

    def forward(self, x: torch.Tensor, ctx: torch.Tensor, rope_q: tuple[torch.Tensor, torch.Tensor],
                rope_k: tuple[torch.Tensor, torch.Tensor], mask: Any, use_flex: bool) -> torch.Tensor:
        bs, lq, _ = x.shape
        kv_in = torch.cat([ctx, x], dim=1)
        lk = kv_in.shape[1]
        q = self.q_norm(self.q_proj(x).view(bs, lq, self.h, self.d)).transpose(1, 2)
        k = self.k_norm(self.k_proj(kv_in).view(bs, lk, self.hkv, self.d)).transpose(1, 2)
        v = self.v_proj(kv_in).view(bs, lk, self.hkv, self.d).transpose(1, 2)
        q = apply_rope(q, *rope_q)
        k = apply_rope(k, *rope_k)
        q, k = q.to(v.dtype), k.to(v.dtype)  # flex attention is not autocast-aware: one dtype for q, k, v
        out = attend(q, k, v, mask, use_flex, 1.0 / math.sqrt(self.d))
        return self.o_proj(out.transpose(1, 2).reshape(bs, lq, self.h * self.d))


class DFlashMLP(nn.Module):
    def __init__(self, a: DrafterArch) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(a.hidden_size, a.intermediate_size, bias=False)
        self.up_proj = nn.Linear(a.hidden_size, a.intermediate_size, bias=False)
        self.down_proj = nn.Linear(a.intermediate_size, a.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DFlashDecoderLayer(nn.Module):
    def __init__(self, a: DrafterArch, layer_type: str) -> None:
        super().__init__()
        self.layer_type = layer_type
        self.self_attn = DFlashAttention(a)
        self.mlp = DFlashMLP(a)
        self.input_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)

    def forward(self, x: torch.Tensor, ctx: torch.Tensor, rope_q: Any, rope_k: Any, mask: Any,
                use_flex: bool) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), ctx, rope_q, rope_k, mask, use_flex)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDrafter(nn.Module):
    """fc + hidden_norm over the target features, N decoder layers, final norm; shared embed/lm_head."""

    def __init__(self, arch: DrafterArch, embed_tokens: nn.Embedding, lm_head: nn.Linear) -> None:
        super().__init__()
        self.arch = arch
        n_feat = len(arch.target_layer_ids)
        self.fc = nn.Linear(n_feat * embed_tokens.weight.shape[1], arch.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashDecoderLayer(arch, t) for t in arch.layer_types)
        self.norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        # The target's embedding and lm_head are held outside the module tree: frozen and shared, they
        # are never sharded (FSDP), synchronised (DDP), moved, saved or exported with the drafter.
        self.__dict__["embed_tokens"] = embed_tokens.requires_grad_(False)
        self.__dict__["lm_head"] = lm_head.requires_grad_(False)
        self._init_weights()

    def _init_weights(self) -> None:
        g_std = 0.02
        for name, p in self.named_parameters():
            if name.startswith(SHARED_PREFIXES) or not p.requires_grad:
                continue
            if p.ndim == 2:
                nn.init.normal_(p, std=g_std)

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """The drafter's own weights (no shared embed / lm_head): what checkpoints and export hold."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith(SHARED_PREFIXES)}

    def load_trainable_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        missing, unexpected = self.load_state_dict(sd, strict=False)
        missing = [k for k in missing if not k.startswith(SHARED_PREFIXES)]
        if missing or unexpected:
            raise ValueError(
                f"drafter weights do not match: missing {missing[:5]}, unexpected {unexpected[:5]}")

    def forward(self, block_ids: torch.Tensor, block_pos: torch.Tensor, features: torch.Tensor,
                masks: AttentionMasks) -> torch.Tensor:
        """block_ids/block_pos [bs, N*B]; features [bs, S, n*H_t] -> final hidden [bs, N*B, H]."""
        a = self.arch
        dtype = self.fc.weight.dtype
        x = self.embed_tokens(block_ids).to(dtype)
        ctx = self.hidden_norm(self.fc(features.to(dtype)))
        bs, s = features.shape[:2]
        ctx_pos = torch.arange(s, device=features.device).expand(bs, s)
        rope_q = rope_cos_sin(block_pos, a.head_dim, a.rope_theta)
        ck, sk = rope_cos_sin(ctx_pos, a.head_dim, a.rope_theta)
        rope_k = (torch.cat([ck, rope_q[0]], dim=1), torch.cat([sk, rope_q[1]], dim=1))
        for layer in self.layers:
            x = layer(x, ctx, rope_q, rope_k, masks.get(layer.layer_type), masks.use_flex)
        return self.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden.to(self.lm_head.weight.dtype))


def build_drafter(cfg: DrafterConfig, target: Any, device: torch.device | None = None) -> DFlashDrafter:
    """A fresh drafter for `target` (a `TargetModel`); frozen embed/lm_head shared, or copied to `device`."""
    import copy

    arch = resolve_arch(cfg, target.config, target.layer_ids, target.vocab_size)
    embed, head = target.embed_tokens, target.lm_head
    tdev = embed.weight.device
    if device is not None and torch.device(device) != tdev:
        embed, head = copy.deepcopy(embed).to(device), copy.deepcopy(head).to(device)
    drafter = DFlashDrafter(arch, embed, head)
    return drafter.to(device=device or tdev, dtype=torch.float32)
