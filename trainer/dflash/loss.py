"""DFlash losses: hard-label CE with exp(-(k-1)/gamma) decay, soft-label KL to the target, D-PACE
streak-aware weights (instead of the decay, never on top of it), context-feature noise; lm_head + loss
in activation-checkpointed chunks.

The draft logits are N*B x vocab (about 4 GB in bf16 per sample at 512 anchors x 16 x 248K), so they are
never materialised whole: `token_losses` runs lm_head + log-softmax over chunks of rows inside
`torch.utils.checkpoint`, keeping only per-row scalars; backward recomputes one chunk at a time.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

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


def feature_noise(features: torch.Tensor, cfg: LossConfig, progress: float,
                  generator: torch.Generator | None) -> torch.Tensor:
    """Gaussian / uniform noise on the context features, std cosine-annealed from noise_std to 0."""
    if cfg.noise == "none" or cfg.noise_std <= 0:
        return features
    frac = min(max(progress, 0.0), 1.0)
    std = cfg.noise_std * (0.5 * (1 + math.cos(math.pi * frac)) if cfg.noise_anneal else 1.0)
    if std == 0:
        return features
    shape, dev = features.shape, features.device
    if cfg.noise == "gaussian":
        n = torch.randn(shape, generator=generator, dtype=torch.float32).to(dev) * std
    else:  # uniform with the same std
        n = (torch.rand(shape, generator=generator, dtype=torch.float32).to(dev) * 2 - 1) * std * math.sqrt(3)
    return features + n.to(features.dtype)


@dataclasses.dataclass
class TokenLosses:
    ce: torch.Tensor  # [R] CE of the hard label
    kl: torch.Tensor  # [R] KL(target || draft) (zeros when no target rows)
    pred: torch.Tensor  # [R] draft argmax
    label: torch.Tensor  # [R] the hard label used (data token or target argmax)


Head = Callable[[torch.Tensor], torch.Tensor]


def _chunk_fn(head: Head, verifier: Head | None, use_target_labels: bool,
              need_kl: bool) -> Callable[..., tuple]:
    def fn(h: torch.Tensor, labels: torch.Tensor, t_rows: torch.Tensor | None):
        logp = F.log_softmax(head(h).float(), dim=-1)
        kl = torch.zeros(h.shape[0], device=h.device)
        if t_rows is not None and verifier is not None:
            with torch.no_grad():
                t_logp = F.log_softmax(verifier(t_rows).float().to(h.device), dim=-1)
            if use_target_labels:
                labels = t_logp.argmax(-1)
            if need_kl:
                kl = (t_logp.exp() * (t_logp - logp)).sum(-1)
        ce = -logp.gather(1, labels[:, None]).squeeze(1)
        return ce, kl, logp.detach().argmax(-1), labels

    return fn


def token_losses(hidden: torch.Tensor, labels: torch.Tensor, head: Callable[[torch.Tensor], torch.Tensor], *,
                 chunk_rows: int, verifier: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 target_rows: torch.Tensor | None = None, use_target_labels: bool = False,
                 need_kl: bool = False, use_checkpoint: bool = True) -> TokenLosses:
    """Per-row CE / KL / argmax for hidden [R, H] in chunks of `chunk_rows` (checkpointed when training)."""
    fn = _chunk_fn(head, verifier, use_target_labels, need_kl)
    outs = []
    for s in range(0, hidden.shape[0], chunk_rows):
        h = hidden[s:s + chunk_rows]
        lab = labels[s:s + chunk_rows]
        t = target_rows[s:s + chunk_rows] if target_rows is not None else None
        if use_checkpoint and torch.is_grad_enabled() and h.requires_grad:
            outs.append(checkpoint(fn, h, lab, t, use_reentrant=False))
        else:
            outs.append(fn(h, lab, t))
    if not outs:
        z = hidden.new_zeros(0)
        return TokenLosses(z, z, labels[:0], labels[:0])
    return TokenLosses(*(torch.cat([o[i] for o in outs]) for i in range(4)))


def combine(ce: torch.Tensor, kl: torch.Tensor, valid: torch.Tensor, cfg: LossConfig, block_size: int
            ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Weighted loss over the [bs, N, B] grid: sum(w * (ce_w CE + kl_w KL)) / sum(w).

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
    loss = cfg.ce_weight * ce_loss + cfg.kl_weight * kl_loss
    return loss, {"ce": ce_loss.detach(), "kl": kl_loss.detach()}
