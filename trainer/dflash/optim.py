"""AdamW over the drafter's trainable (fp32 master) weights and a linear-warmup + cosine schedule over the
run's progress."""
from __future__ import annotations

import math

import torch

from trainer.dflash.config import TrainConfig


def build_optimizer(params: list[torch.nn.Parameter], cfg: TrainConfig) -> torch.optim.Optimizer:
    if not params:
        raise ValueError("the drafter has no trainable parameters")
    fused = all(p.is_cuda for p in params)
    return torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay,
                             fused=fused or None)


def lr_multiplier(start: float, end: float, warmup_ratio: float, min_lr_ratio: float) -> float:
    """Multiplier of train.lr for a step that takes the run from progress `start` to `end` (shares of the
    run, 0..1): a linear warmup that reaches 1 at `warmup_ratio` (a step's rate is the one it ends at, so the
    first step does not train at 0), then a cosine from the step's start down to `min_lr_ratio` at the end."""
    start, end = min(1.0, max(0.0, start)), min(1.0, max(0.0, end))
    if warmup_ratio > 0 and start < warmup_ratio:
        return min(1.0, end / warmup_ratio)
    t = (start - warmup_ratio) / max(1e-12, 1.0 - warmup_ratio)
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t))


class ProgressSchedule:
    """The learning rate as a function of the run's progress (the share of its batches consumed, over all
    ranks), not of a step count: steps depend on the world size, samples do not, so a resume on another
    number of ranks continues the same curve. The rate is set from the run config's `train.lr` at every
    step, so an edited `train.lr` takes effect on resume."""

    def __init__(self, opt: torch.optim.Optimizer, cfg: TrainConfig) -> None:
        self.opt, self.cfg = opt, cfg
        self.last_lr = 0.0

    def set(self, start: float, end: float) -> float:
        """Set every param group's lr for a step from progress `start` to `end`; returns it."""
        lr = self.cfg.lr * lr_multiplier(start, end, self.cfg.warmup_ratio, self.cfg.min_lr_ratio)
        for group in self.opt.param_groups:
            group["lr"] = lr
        self.last_lr = lr
        return lr

    def apply_hyperparameters(self) -> None:
        """The run config's betas and weight decay on every param group (a checkpoint's optimizer state
        brings back the values it was saved with)."""
        for group in self.opt.param_groups:
            group["betas"] = tuple(self.cfg.betas)
            group["weight_decay"] = self.cfg.weight_decay

