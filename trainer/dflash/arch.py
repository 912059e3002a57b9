"""The drafter's architecture resolved from the run config and the target's config, without torch.

`resolve_arch` fills every size that ``drafter:`` leaves at 0 from the target's config; it is shared by
the model code (trainer/dflash/drafter.py) and by `python -m trainer plan`, which runs on a controller
that may have no torch installed.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from trainer.dflash.config import DrafterConfig


def default_layer_ids(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
    """DFlash's target layer ids: round(1 + i*(L-4)/(n-1)); L=64, n=5 -> (1, 16, 31, 46, 61).

    Id k is the *output* of 0-based decoder layer k, i.e. HF ``hidden_states[k + 1]``.
    """
    if num_draft_layers == 1:
        return (num_target_layers // 2,)
    span = num_target_layers - 4
    return tuple(round(1 + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers))


@dataclasses.dataclass(frozen=True)
class DrafterArch:
    """Resolved drafter architecture (every size a number); saved as the export's config.json core."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    layer_types: tuple[str, ...]
    sliding_window: int
    rope_theta: float
    rms_norm_eps: float
    vocab_size: int
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    num_target_layers: int
    sliding_block_causal: bool = True


def _target_rope_theta(tcfg: Any) -> float:
    rp = getattr(tcfg, "rope_parameters", None) or {}
    if isinstance(rp, dict) and "rope_theta" in rp:
        return float(rp["rope_theta"])
    return float(getattr(tcfg, "rope_theta", 1e6))


# SpecForge's DFlash drafters are Qwen3 decoder layers with 32 query heads x 128 and 8 KV heads whatever the
# target's attention: configs/qwen3.6-27b-dflash.json (a6b6b02) has hidden 5120, num_attention_heads 32,
# head_dim 128, num_key_value_heads 8 while Qwen3.6-27B itself has 24 x 256 and 4 KV heads; so do
# qwen3-4b/-8b and qwen3.5-4b-dflash.json. Its one small-target config (qwen2.5-0.5b-dflash.json) copies
# the target's 14 x 64 / 2 instead. Rule here: targets with hidden_size >= 2048 get SpecForge's shape, smaller
# ones (the tests' and the lab's tiny models) the target's own attention shape.
SPECFORGE_HEADS, SPECFORGE_KV_HEADS, SPECFORGE_HEAD_DIM = 32, 8, 128
SPECFORGE_SHAPE_MIN_HIDDEN = 2048


def default_attention_shape(tcfg: Any) -> tuple[int, int, int]:
    """(heads, kv heads, head_dim) of the drafter when drafter.* leaves them at 0."""
    hidden = int(tcfg.hidden_size)
    if hidden >= SPECFORGE_SHAPE_MIN_HIDDEN:
        return SPECFORGE_HEADS, SPECFORGE_KV_HEADS, SPECFORGE_HEAD_DIM
    heads = int(tcfg.num_attention_heads)
    return (heads, int(getattr(tcfg, "num_key_value_heads", 0) or heads),
            int(getattr(tcfg, "head_dim", 0) or hidden // heads))


def resolve_arch(cfg: DrafterConfig, tcfg: Any, layer_ids: tuple[int, ...], vocab_size: int) -> DrafterArch:
    """Fill every unset (0 / empty) drafter size from the target's config (attention: see above)."""
    hidden = cfg.hidden_size or int(tcfg.hidden_size)
    d_heads, d_kv, d_head_dim = default_attention_shape(tcfg)
    head_dim = cfg.head_dim or d_head_dim
    heads = cfg.num_attention_heads or d_heads
    kv = cfg.num_key_value_heads or d_kv
    if heads % kv:
        raise ValueError(f"drafter.num_attention_heads={heads} is not a multiple of num_key_value_heads={kv}")
    if not 0 <= cfg.mask_token_id < vocab_size:
        raise ValueError(f"drafter.mask_token_id={cfg.mask_token_id} is outside the target vocabulary "
                         f"(0..{vocab_size - 1})")
    types = cfg.layer_types or (("sliding_attention",) * (cfg.num_layers - 1) + ("full_attention",))
    return DrafterArch(
        hidden_size=hidden, intermediate_size=cfg.intermediate_size or int(tcfg.intermediate_size),
        num_layers=cfg.num_layers, num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim,
        layer_types=tuple(types), sliding_window=cfg.sliding_window,
        rope_theta=cfg.rope_theta or _target_rope_theta(tcfg), rms_norm_eps=cfg.rms_norm_eps,
        vocab_size=vocab_size, block_size=cfg.block_size, mask_token_id=cfg.mask_token_id,
        target_layer_ids=tuple(layer_ids), num_target_layers=int(tcfg.num_hidden_layers),
    )
