"""The ranks' agreement to stop after a signal (SIGINT / SIGTERM), without waiting for the GPU each step.

Every rank must stop after the same step (the checkpoint it writes is a collective). A signal reaches the
ranks at different moments, so each step every rank posts its own flag in a one-element all-reduce queued
behind the step's work, and decides on the previous step's result: that copy is done by the time the host
has queued the next step (the GPU is at most a step behind), so reading it does not wait for the step in
flight. Every rank reads the same sum on the same step; the run stops one step after the signal. A single
process needs no vote: its own flag decides, at once.
"""
from __future__ import annotations

import torch

from trainer.dflash import device as dev


class StopVote:
    """Call once per step with this rank's flag; returns whether the ranks agreed to stop."""

    def __init__(self, device: torch.device, distributed: bool) -> None:
        self.device, self.distributed = device, distributed
        self._last: dev.HostCopy | None = None

    def __call__(self, local: bool) -> bool:
        if not self.distributed:
            return local
        flag = torch.full((1,), 1.0 if local else 0.0, device=self.device)  # a fill: no copy from the host
        dev.all_reduce_sum(flag)
        last, self._last = self._last, dev.HostCopy(flag)
        return last is not None and bool(last.get()[0] > 0)
