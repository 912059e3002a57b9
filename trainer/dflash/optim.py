"""AdamW over the drafter's trainable (fp32 master) weights and a linear-warmup + cosine schedule."""
from __future__ import annotations

import math
from collections.abc import Callable

import torch

from trainer.dflash.config import TrainConfig


def build_optimizer(params: list[torch.nn.Parameter], cfg: TrainConfig) -> torch.optim.Optimizer:
    if not params:
        raise ValueError("the drafter has no trainable parameters")
    fused = all(p.is_cuda for p in params)
    return torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay,
                             fused=fused or None)


def lr_lambda(total_steps: int, warmup_ratio: float, min_lr_ratio: float) -> Callable[[int], float]:
    """Multiplier of lr at optimizer step s: linear warmup to 1, cosine down to min_lr_ratio."""
    warmup = max(0, round(total_steps * warmup_ratio))

    def f(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        span = max(1, total_steps - warmup)
        t = min(1.0, (step - warmup) / span)
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t))

    return f


def build_scheduler(opt: torch.optim.Optimizer, cfg: TrainConfig,
                    total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(total_steps, cfg.warmup_ratio, cfg.min_lr_ratio))
