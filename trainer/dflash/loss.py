"""DFlash losses: hard-label CE with exp(-(k-1)/gamma) decay, soft-label KL to the target, D-PACE
streak-aware weights (instead of the decay, never on top of it), context-feature noise; lm_head + loss
fused and chunked.

The draft logits are N*B x vocab (about 4 GB in bf16 per sample at 512 anchors x 16 x 248K), so they are
never materialised whole: `token_losses` runs lm_head + log-softmax over chunks of rows and keeps only
per-row values: CE, KL, argmax, and the gradient of the loss's per-row term (ce_weight CE + kl_weight
KL) with respect to the row's hidden state, computed in the forward (the lm_head is frozen, so d/dh is
all backward needs, and the two logit gradients are summed before one matmul with its weight). The
drafter's lm_head and the verifier's (the target's final norm + lm_head) each run once per chunk;
nothing is recomputed.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from trainer.dflash.config import LossConfig

_GAMMA_BY_BLOCK = {16: 7.0, 10: 5.0, 8: 4.0}


def decay_gamma(cfg: LossConfig, block_size: int) -> float:
    """gamma for exp(-(k-1)/gamma): configured, else 7 for B=16, 5 for B=10, 4 for B=8 (B/2.3 otherwise)."""
    if cfg.decay_gamma != 0:
        return cfg.decay_gamma
    return _GAMMA_BY_BLOCK.get(block_size, block_size / 2.3)


def slot_decay(block_size: int, gamma: float, device: torch.device | None = None) -> torch.Tensor:
    """[B] weights: 0 for slot 0 (the anchor), exp(-(k-1)/gamma) for k >= 1 (all 1 when gamma < 0)."""
    k = torch.arange(block_size, dtype=torch.float32, device=device)
    w = torch.ones_like(k) if gamma < 0 else torch.exp(-(k - 1) / gamma)
    w[0] = 0.0
    return w


def dpace_weights(ce: torch.Tensor, valid: torch.Tensor, alpha: float) -> torch.Tensor:
    """D-PACE: q_k = exp(-CE_k) (detached), q~ = (1-a) q + a, P_m = prod_{i<=m} q~_i, w_k = sum_{m>=k} P_m.

    ce, valid: [..., K] over the draft slots 1..B-1 of each block. An invalid slot is a multiplicative
    no-op in the prefix product (q~ = 1) and is left out of the suffix sum; the caller still multiplies
    the result by `valid`. As in SpecForge (a6b6b02) specforge/algorithms/common/dflash_family_model.py
    L245-275 `_dpace_weight`: ``smooth = where(binary_mask_b, (1-alpha)*prob + alpha, 1)``,
    ``prefix = cumprod(smooth)``, ``suffix = flip(cumsum(flip(prefix * binary_mask)))``.
    """
    ok = valid.bool()
    q = torch.exp(-ce.detach().float())
    qt = torch.where(ok, (1 - alpha) * q + alpha, torch.ones_like(q))
    p = torch.cumprod(qt, dim=-1) * ok
    return torch.flip(torch.cumsum(torch.flip(p, [-1]), -1), [-1])


def feature_noise(features: torch.Tensor, cfg: LossConfig, progress: float, *, seed: int | None = None,
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """Gaussian / uniform noise on the context features, std cosine-annealed from noise_std to 0.

    The noise is drawn on the features' device from a generator seeded with `seed` (nothing crosses
    the host-device link), so a given seed gives the same noise on every run. Without `seed`, one is
    drawn from `generator` (the process-wide RNG when that is None too); nothing is drawn when no
    noise applies.
    """
    if cfg.noise == "none" or cfg.noise_std <= 0:
        return features
    frac = min(max(progress, 0.0), 1.0)
    std = cfg.noise_std * (0.5 * (1 + math.cos(math.pi * frac)) if cfg.noise_anneal else 1.0)
    if std == 0:
        return features
    if seed is None:
        seed = int(torch.randint(0, 2**63 - 1, (), generator=generator))
    g = torch.Generator(device=features.device).manual_seed(seed)
    shape, dev = features.shape, features.device
    if cfg.noise == "gaussian":
        n = torch.randn(shape, generator=g, dtype=torch.float32, device=dev).mul_(std)
    else:  # uniform with the same std
        n = torch.rand(shape, generator=g, dtype=torch.float32, device=dev).mul_(2).sub_(1)
        n.mul_(std * math.sqrt(3))
    return features + n.to(features.dtype)


@dataclasses.dataclass
class TokenLosses:
    ce: torch.Tensor  # [R] CE of the hard label
    kl: torch.Tensor  # [R] KL(target || draft) (zeros when no target rows)
    pred: torch.Tensor  # [R] draft argmax
    label: torch.Tensor  # [R] the hard label used (data token or target argmax)
    # [R] ce_weight * CE + kl_weight * KL when token_losses was given `mix` (the one tensor the gradient
    # flows through then); None otherwise
    mixed: torch.Tensor | None = None


Verifier = Callable[[torch.Tensor], torch.Tensor]


def _chunk(h: torch.Tensor, labels: torch.Tensor, head: nn.Linear, t_logp: torch.Tensor | None,
           need_kl: bool, ce_grad: bool, kl_grad: bool,
           mix: tuple[float, float] | None = None) -> tuple[torch.Tensor, ...]:
    """CE, KL, argmax of one chunk of rows, and d CE / d h, d KL / d h when asked (else None). With
    `mix` = (a, b): one gradient, d (a CE + b KL) / d h, in the first slot (the second is None): the
    two logit gradients are summed before the one matmul with the head's weight."""
    w = head.weight
    logp = F.log_softmax(head(h.to(w.dtype)).float(), dim=-1)  # the matmul as `DFlashDrafter.logits` does
    ce = -logp.gather(1, labels[:, None]).squeeze(1)
    pred = logp.argmax(-1)
    kl = torch.zeros_like(ce)
    pt = None
    if need_kl and t_logp is not None:
        pt = t_logp.exp()
        kl = torch.sub(t_logp, logp).mul_(pt).sum(-1)
    d_ce = d_kl = None
    if mix is not None:
        a, b = mix
        if not (a or (b and kl_grad and pt is not None)):
            return ce, kl, pred, None, None
        p = logp.exp_()  # softmax
        if b and kl_grad and pt is not None:
            # a (p - onehot) + b (p sum(pt) - pt) = p (a + b sum(pt)) - b pt - a onehot
            g = p.mul_(pt.sum(-1, keepdim=True).mul(b).add_(a)).sub_(pt, alpha=b)
        else:
            g = p.mul_(a)
        if a:
            g.scatter_add_(1, labels[:, None], torch.full_like(ce[:, None], -a))
        return ce, kl, pred, (g.to(w.dtype) @ w).to(h.dtype), None
    if ce_grad or (kl_grad and pt is not None):
        p = logp.exp_()  # softmax; logp is not needed any more
        if kl_grad and pt is not None:
            # d KL / d logits = softmax * sum(p_target) - p_target (sum(p_target) is 1 up to rounding)
            d_kl = (torch.mul(p, pt.sum(-1, keepdim=True)).sub_(pt).to(w.dtype) @ w).to(h.dtype)
        if ce_grad:  # d CE / d logits = softmax - onehot(label)
            p.scatter_add_(1, labels[:, None], torch.full_like(ce[:, None], -1.0))
            d_ce = (p.to(w.dtype) @ w).to(h.dtype)
    return ce, kl, pred, d_ce, d_kl


def _verifier_logp(verifier: Verifier | None, rows: torch.Tensor | None) -> torch.Tensor | None:
    if verifier is None or rows is None:
        return None
    with torch.no_grad():
        return F.log_softmax(verifier(rows).float(), dim=-1)


def _run(hidden: torch.Tensor, labels: torch.Tensor, head: nn.Linear, verifier: Verifier | None,
         target_rows: torch.Tensor | None, chunk_rows: int, use_target_labels: bool, need_kl: bool,
         ce_grad: bool, kl_grad: bool, mix: tuple[float, float] | None = None
         ) -> tuple[torch.Tensor | None, ...]:
    """All chunks: ce, kl, pred, label [R] and d CE / d h, d KL / d h [R, H] (None when not asked); with
    `mix`, d (a CE + b KL) / d h in the first gradient slot."""
    r, dev = hidden.shape[0], hidden.device
    ce, kl = torch.empty(r, device=dev), torch.empty(r, device=dev)
    pred, label = torch.empty(r, dtype=torch.long, device=dev), labels.clone()
    if mix is not None:
        ce_grad, kl_grad = bool(mix[0]) or (bool(mix[1]) and kl_grad), False
    d_ce = torch.empty_like(hidden) if ce_grad else None
    d_kl = torch.empty_like(hidden) if kl_grad else None
    for s in range(0, r, chunk_rows):
        e = min(s + chunk_rows, r)
        t_logp = _verifier_logp(verifier, None if target_rows is None else target_rows[s:e])
        if use_target_labels and t_logp is not None:
            label[s:e] = t_logp.argmax(-1)
        ce[s:e], kl[s:e], pred[s:e], dc, dk = _chunk(hidden[s:e], label[s:e], head, t_logp, need_kl,
                                                     ce_grad, kl_grad or mix is not None, mix)
        if dc is not None:
            d_ce[s:e] = dc
        if dk is not None:
            d_kl[s:e] = dk
    return ce, kl, pred, label, d_ce, d_kl


class _FusedHeadLoss(torch.autograd.Function):
    """Per-row CE / KL through the frozen lm_head, chunk by chunk, with d/dh computed in the forward.

    Each chunk's logits and the verifier's log-probs live only while that chunk is processed; what is
    kept for backward is d CE / d h and d KL / d h ([R, H] each, in h's dtype), so backward is two
    scaled sums and nothing is recomputed. With `mix` = (a, b) (the loss's ce_weight and kl_weight),
    the gradient flows through one output, `mixed` = a CE + b KL per row, whose d/dh is one [R, H]
    tensor from one matmul per chunk (the lm_head is frozen, so the two logit gradients can be summed
    before it): half the matmuls and half the memory kept for backward when both terms are on.
    """

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, labels: torch.Tensor, head: nn.Linear,
                verifier: Verifier | None, target_rows: torch.Tensor | None, chunk_rows: int,
                use_target_labels: bool, need_kl: bool, ce_grad: bool,
                mix: tuple[float, float] | None) -> tuple[torch.Tensor, ...]:
        kl_grad = need_kl and verifier is not None and target_rows is not None
        ce, kl, pred, label, d_ce, d_kl = _run(hidden, labels, head, verifier, target_rows, chunk_rows,
                                               use_target_labels, need_kl, ce_grad, kl_grad, mix)
        ctx.save_for_backward(d_ce, d_kl)
        if mix is None:
            mixed = torch.empty(0, device=ce.device)
            ctx.mark_non_differentiable(*([] if ce_grad else [ce]), *([] if kl_grad else [kl]), pred, label,
                                        mixed)
        else:
            mixed = ce * mix[0] + kl * mix[1]
            ctx.mark_non_differentiable(ce, kl, pred, label, *([] if d_ce is not None else [mixed]))
        ctx.set_materialize_grads(False)
        return ce, kl, pred, label, mixed

    @staticmethod
    def backward(ctx: Any, g_ce: torch.Tensor | None, g_kl: torch.Tensor | None, _g_pred: Any, _g_label: Any,
                 g_mixed: torch.Tensor | None) -> tuple:
        d_ce, d_kl = ctx.saved_tensors
        if g_mixed is not None:  # `mix`: the one gradient, in d_ce's slot
            g_ce, g_kl = g_mixed, None
        grad = None
        for g, d in ((g_ce, d_ce), (g_kl, d_kl)):
            if g is not None and d is not None:
                term = g[:, None] * d.float()
                grad = term if grad is None else grad.add_(term)
        if grad is not None:
            grad = grad.to(d_ce.dtype if d_ce is not None else d_kl.dtype)
        return grad, None, None, None, None, None, None, None, None, None


def token_losses(hidden: torch.Tensor, labels: torch.Tensor, head: nn.Linear, *, chunk_rows: int,
                 verifier: Verifier | None = None, target_rows: torch.Tensor | None = None,
                 use_target_labels: bool = False, need_kl: bool = False, ce_grad: bool = True,
                 mix: tuple[float, float] | None = None) -> TokenLosses:
    """Per-row CE / KL(target || draft) / argmax of hidden [R, H] through the frozen `head`.

    Rows go through `head` (an nn.Linear, matmul in its weight dtype, log-softmax in fp32) in chunks of
    `chunk_rows`, so no [R, vocab] tensor outlives its chunk. `verifier(target_rows[chunk])` gives the
    target's logits for the chunk (evaluated once, without grad, on h's device): its log-probs feed the
    KL (`need_kl`) and, with `use_target_labels`, its argmax replaces `labels`. When hidden requires
    grad, d CE / d h and d KL / d h are computed chunk by chunk in the forward and backward only scales
    them, so each matmul runs once; `ce_grad=False` skips the CE gradient (ce then carries no grad).
    `mix` = (ce_weight, kl_weight): the gradient flows through `mixed` = ce_weight CE + kl_weight KL
    alone (ce and kl carry none), one matmul per chunk for both terms (`combine(..., mixed=)`).
    """
    if head.weight.requires_grad or (head.bias is not None and head.bias.requires_grad):
        raise ValueError("token_losses: the lm_head must be frozen (no gradient flows to its weights)")
    if target_rows is not None and target_rows.shape[0] != hidden.shape[0]:
        raise ValueError(f"token_losses: {target_rows.shape[0]} target rows for {hidden.shape[0]} rows")
    if not (need_kl or use_target_labels):
        target_rows = None  # the verifier is not needed
    args = (hidden, labels, head, verifier, target_rows, chunk_rows, use_target_labels, need_kl)
    if torch.is_grad_enabled() and hidden.requires_grad:
        ce, kl, pred, label, mixed = _FusedHeadLoss.apply(*args, ce_grad, mix)
        return TokenLosses(ce, kl, pred, label, mixed if mix is not None else None)
    with torch.no_grad():
        ce, kl, pred, label = _run(*args, False, False)[:4]
        return TokenLosses(ce, kl, pred, label, None if mix is None else ce * mix[0] + kl * mix[1])


def combine(ce: torch.Tensor, kl: torch.Tensor, valid: torch.Tensor, cfg: LossConfig, block_size: int,
            mixed: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Weighted loss over the [bs, N, B] grid: sum(w * (ce_w CE + kl_w KL)) / sum(w); `mixed` (the
    grid of ce_w CE + kl_w KL from token_losses' `mix`) is what the loss is computed from when given.

    w is the decay (loss.dpace false) or the D-PACE weights (loss.dpace true; loss.decay_gamma unused).
    Normalised by sum(w) in both cases; SpecForge divides its D-PACE sum by the batch size instead
    (L455-458 of the same file), a per-step scale that AdamW largely cancels.
    """
    if cfg.dpace:
        # D-PACE replaces the exp(-(k-1)/gamma) decay, it does not multiply it: SpecForge (a6b6b02)
        # dflash_family_model.py L350-372 applies `decay_weights` only when loss_type == "dflash" and
        # uses `neg_log_q * weight_mask * dpace_weights` for the D-PACE loss types.
        w = torch.zeros_like(valid, dtype=torch.float32)
        w[..., 1:] = valid[..., 1:].float() * dpace_weights(ce[..., 1:], valid[..., 1:], cfg.dpace_alpha)
    else:
        w = valid.float() * slot_decay(block_size, decay_gamma(cfg, block_size), ce.device)
    denom = w.sum().clamp(min=1e-12)
    ce_loss = (w * ce).sum() / denom
    kl_loss = (w * kl).sum() / denom
    if mixed is not None:
        loss = (w * mixed).sum() / denom
    else:
        loss = cfg.ce_weight * ce_loss + cfg.kl_weight * kl_loss
    return loss, {"ce": ce_loss.detach(), "kl": kl_loss.detach()}
