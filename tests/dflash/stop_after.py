"""Test seam: stop a training run after N optimizer steps, as if it were killed right after a checkpoint.

The trainer has no switch for this (a run stops when it ends, or on SIGINT/SIGTERM with exit 130); the
kill-and-resume tests patch `Trainer` here instead. Once N steps are done, the next step writes the
checkpoint of step N (unless that step already has one) and the run returns a `TrainResult` with
`stopped_early` set, without exporting, on every rank alike (`save` is a collective).

    with stop_after(5):                      # in the test's process
        result = train(cfg)

    python -m torch.distributed.run ... tests/dflash/stop_after.py 3 train RUN.yml [ARGS...]
                                             # under torchrun: the trainer's CLI, stopped after 3 steps
"""
from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainer.dflash.loop import Trainer, TrainResult


class _Stopped(Exception):
    def __init__(self, checkpoint: Path | None) -> None:
        super().__init__("stopped by the test seam")
        self.checkpoint = checkpoint


@contextlib.contextmanager
def stop_after(steps: int) -> Iterator[None]:
    """While active, every `Trainer` stops once `steps` optimizer steps are done (checkpoint first)."""
    step_fn, run_fn = Trainer._train_step, Trainer.run

    def _train_step(self: Trainer, it: Any) -> Any:
        if self.step >= steps:
            raise _Stopped(self.save() if self._saved_step != self.step else None)
        return step_fn(self, it)

    def run(self: Trainer) -> TrainResult:
        try:
            return run_fn(self)
        except _Stopped as s:
            return TrainResult(self.step, self.total_steps, [], {}, s.checkpoint, None, stopped_early=True)

    Trainer._train_step, Trainer.run = _train_step, run  # type: ignore[method-assign]
    try:
        yield
    finally:
        Trainer._train_step, Trainer.run = step_fn, run_fn  # type: ignore[method-assign]


if __name__ == "__main__":  # stop_after.py N ARGS...: `python -m trainer ARGS...`, stopped after N steps
    from trainer.cli import main

    with stop_after(int(sys.argv[1])):
        sys.exit(main(sys.argv[2:]))
