"""Block-sparse DFlash attention masks: dense boolean masks for SDPA (CPU) and flex BlockMasks (GPU).

Layout of one sample: queries are the N blocks of B slots (row r = j*B + i, position a_j + i); keys are
``[context 0..S-1 ; the N*B block slots]``. Block j may see

* context keys kv < a_j (strictly: the anchor's own target state is not known at draft time),
  and for sliding layers only those with (a_j + i) - kv < window;
* its own block: all of it (full layers: bidirectional), or slots i' <= i (sliding layers when
  ``block_causal``); never another block.

A padding block (keep = False, anchor 0) sees no context and only its own block: every row has a key
(no all-masked row, so SDPA gives no NaN), and no kept block sees it, so kept blocks' outputs do not
depend on how many padding blocks there are.

Both builders evaluate the same predicate (`_allowed`), so SDPA and flex give the same numbers.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

from trainer.dflash import device as dev


@dataclasses.dataclass(frozen=True)
class MaskSpec:
    block_size: int
    ctx_len: int  # S
    window: int = 0  # 0 = no window (full layer)
    block_causal: bool = False


def _allowed(spec: MaskSpec, anchors: torch.Tensor, b: torch.Tensor, q: torch.Tensor,
             kv: torch.Tensor) -> torch.Tensor:
    """The mask predicate on broadcastable index tensors (batch b, query row q, key column kv)."""
    bsz, s = spec.block_size, spec.ctx_len
    j = q // bsz
    i = q % bsz
    a = anchors[b, j]
    is_ctx = kv < s
    ctx_ok = is_ctx & (kv < a)
    if spec.window > 0:
        ctx_ok = ctx_ok & ((a + i - kv) < spec.window)
    # Negative on the context columns, which ~is_ctx drops. No clamp: with one, inductor's compile of
    # create_block_mask fails ("vr must not be None for symbol q1", torch 2.13).
    kb = kv - s
    blk_ok = (~is_ctx) & (kb // bsz == j)
    if spec.block_causal:
        blk_ok = blk_ok & (kb % bsz <= i)
    return ctx_ok | blk_ok


def dense_mask(spec: MaskSpec, anchors: torch.Tensor) -> torch.Tensor:
    """Boolean SDPA mask [bs, 1, N*B, S+N*B] (True = attend)."""
    bs, n = anchors.shape
    nq = n * spec.block_size
    b = torch.arange(bs, device=anchors.device)[:, None, None]
    q = torch.arange(nq, device=anchors.device)[None, :, None]
    kv = torch.arange(spec.ctx_len + nq, device=anchors.device)[None, None, :]
    return _allowed(spec, anchors, b, q, kv)[:, None]


def flex_block_mask(spec: MaskSpec, anchors: torch.Tensor) -> Any:
    """A flex-attention BlockMask with the same predicate, built by the compiled create_block_mask on GPU.

    One compiled graph per (batch size, S, spec): `spec` is read as constants, `anchors` is a tensor
    input, so new anchor values reuse the graph of their shape.
    """
    bs, n = anchors.shape
    nq = n * spec.block_size

    def mask_mod(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        return _allowed(spec, anchors, b, q_idx, kv_idx)

    build = dev.create_block_mask_fn(anchors.device)
    return build(mask_mod, bs, None, nq, spec.ctx_len + nq, device=str(anchors.device))


class AttentionMasks:
    """Per layer type masks for one batch, built once per step and shared by the drafter's layers."""

    def __init__(self, anchors: torch.Tensor, ctx_len: int, block_size: int, sliding_window: int,
                 block_causal_sliding: bool, use_flex: bool | None = None) -> None:
        self.use_flex = dev.flex_enabled(anchors.device) if use_flex is None else use_flex
        self.specs = {
            "full_attention": MaskSpec(block_size, ctx_len, 0, False),
            "sliding_attention": MaskSpec(block_size, ctx_len, sliding_window, block_causal_sliding),
        }
        self.anchors = anchors
        self._cache: dict[str, Any] = {}

    def get(self, layer_type: str) -> Any:
        if layer_type not in self._cache:
            spec = self.specs[layer_type]
            build = flex_block_mask if self.use_flex else dense_mask
            self._cache[layer_type] = build(spec, self.anchors)
        return self._cache[layer_type]


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, use_flex: bool,
           scale: float) -> torch.Tensor:
    """Attention [bs, h, Lq, d] x [bs, hkv, Lk, d] with GQA, through flex or SDPA."""
    if use_flex:
        fn = dev.flex_attention_fn(q.device)
        return fn(q, k, v, block_mask=mask, scale=scale, enable_gqa=k.shape[1] != q.shape[1])
    if k.shape[1] != q.shape[1]:
        rep = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
