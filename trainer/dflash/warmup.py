"""Compile every batch shape before step 1, with a progress line per shape.

Flex attention and its block masks compile once per (rows, padded length, mask kind) (`trainer.dflash.
device`). Left to the first step that meets a shape, a compile would run in the middle of the run, on one
rank while the others wait in an FSDP collective for it (minutes for the long buckets, against the process
group's timeout), and the first hours' step times would be noise. So when flex is compiled (on GPU), the
train loop runs one forward and backward of every shape the loader can produce before step 1, printing
``compile i/N: length L, R rows, T s``; no compile happens after it. With nothing compiled (CPU) it does
nothing.

The sweep leaves no trace on training: explicit anchors (no draw from any generator), feature noise from
its own seed, gradients dropped before the first step; every rank sweeps the same shapes in the same order
(their collectives match).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import torch

from trainer.dflash.step import Batch

log = logging.getLogger(__name__)


def compile_sweep(shapes: Sequence[tuple[int, int]], run: Callable[[int, int], None],
                  report: Callable[..., None] = log.info) -> float:
    """Call `run(rows, length)` for every shape in order, reporting each one's time; the total seconds."""
    start = time.perf_counter()
    for i, (rows, length) in enumerate(shapes, 1):
        t0 = time.perf_counter()
        run(rows, length)
        now = time.perf_counter()
        report("compile %d/%d: length %d, %d rows, %.1f s (%.0f s in all)", i, len(shapes), length, rows,
               now - t0, now - start)
    return time.perf_counter() - start


def sweep_batch(rows: int, length: int, max_anchors: int) -> tuple[Batch, tuple[torch.Tensor, torch.Tensor]]:
    """A batch of `rows` full-length samples of `length` tokens on the host, and its anchors: as many
    blocks as training gives that length (min(max_anchors, length), `sample_anchors`), the last one a
    padding block as in a real batch."""
    ids = torch.zeros(rows, length, dtype=torch.long)
    batch = Batch(ids, torch.ones_like(ids), torch.full((rows,), length, dtype=torch.long))
    n = max(1, min(max_anchors, length))
    anchors = torch.linspace(0, max(0, length - 2), n).long().expand(rows, n).clone()
    keep = torch.ones(rows, n, dtype=torch.bool)
    if n > 1:
        keep[:, -1] = False
        anchors[:, -1] = 0
    return batch, (anchors, keep)
