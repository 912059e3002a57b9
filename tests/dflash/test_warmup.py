"""Every batch shape compiled before step 1, with a progress line per shape, and no compile after it.

On CPU nothing is compiled and the sweep does nothing. The compiled case runs here with flex attention
compiled by dynamo + AOT autograd ("aot_eager", `dev.cpu_flex_compile`) instead of inductor: the same
functions, budget and shapes as on GPU, so the count of graphs before and after the first step is the
GPU's. Only a GPU shows the time the sweep saves (inductor's flex kernels take seconds to minutes per
shape) and that no rank stalls in an FSDP collective while another compiles.
"""
from __future__ import annotations

import logging
import random

import pytest
import torch
from torch._dynamo.utils import counters

from trainer.config import load_run_config
from trainer.data.sampler import BucketBatchSampler
from trainer.dflash import device as dev
from trainer.dflash import loop, warmup
from trainer.dflash.buckets import batch_shapes, bucket_bounds
from trainer.dflash.step import collate


def test_compile_sweep_reports_each_shape_in_order() -> None:
    seen, lines = [], []
    total = warmup.compile_sweep([(4, 128), (2, 256)], lambda r, n: seen.append((r, n)),
                                 lambda fmt, *a: lines.append(fmt % a))
    assert seen == [(4, 128), (2, 256)] and total >= 0
    assert lines[0].startswith("compile 1/2: length 128, 4 rows, ")
    assert lines[1].startswith("compile 2/2: length 256")


@pytest.mark.parametrize("world", [1, 2])
def test_the_sweep_shapes_are_every_shape_the_loader_produces(world: int) -> None:
    rng = random.Random(1)
    lengths = [rng.randrange(30, 700) for _ in range(90)]
    max_length = 600
    bounds = bucket_bounds(lengths, max_length)
    produced = set()
    for rank in range(world):
        sampler = BucketBatchSampler(lengths, batch_size=4, seed=0, rank=rank, world_size=world,
                                     boundaries=bounds)
        for epoch in range(3):
            sampler.set_epoch(epoch)
            for idx in sampler:
                b = collate([{"input_ids": [1] * lengths[i], "loss_mask": [1] * lengths[i]} for i in idx],
                            pad_to=sampler.pad_to(idx), max_length=max_length)
                produced.add(tuple(b.input_ids.shape))
    assert set(batch_shapes(sampler.shapes(), max_length)) == produced


def test_sweep_batch_has_the_training_block_count() -> None:
    batch, (anchors, keep) = warmup.sweep_batch(3, 40, max_anchors=8)
    assert batch.input_ids.shape == (3, 40) and anchors.shape == keep.shape == (3, 8)
    assert keep[:, :-1].all() and not keep[:, -1].any()  # a padding block, as real batches have


def _rows() -> list[tuple[list[int], list[int]]]:
    rng = random.Random(2)  # two buckets: up to 128 tokens and up to 256 (padded to max_length 192)
    out = []
    for n in [100, 120, 90, 110, 150, 180, 170, 200]:
        out.append(([rng.randrange(500) for _ in range(n)], [0] * 8 + [1] * (n - 8)))
    return out


def test_cpu_without_compile_sweeps_nothing(make_run, monkeypatch: pytest.MonkeyPatch) -> None:
    called = []
    monkeypatch.setattr(loop, "compile_sweep", lambda *a, **k: called.append(a) or 0.0)
    cfg = load_run_config(make_run(rows=_rows(), data={"max_length": 192},
                                   train={"max_steps": 1, "batch_size": 2}))
    loop.train(cfg)
    assert not called


@pytest.mark.slow
def test_compiled_run_compiles_every_shape_before_step_one(make_run, monkeypatch: pytest.MonkeyPatch,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    cfg = load_run_config(make_run(rows=_rows(), data={"max_length": 192},
                                   train={"epochs": 1, "max_steps": 0, "batch_size": 3, "log_every": 2}))
    monkeypatch.setattr(dev, "flex_enabled", lambda device: True)  # flex on CPU, as on GPU
    swept: list[tuple[int, int]] = []
    graphs_after_sweep: list[int] = []
    sweep = loop.compile_sweep

    def counted(shapes, run, report):  # type: ignore[no-untyped-def]
        total = sweep(shapes, lambda r, n: (swept.append((r, n)), run(r, n))[1], report)
        graphs_after_sweep.append(counters["stats"]["unique_graphs"])
        return total

    monkeypatch.setattr(loop, "compile_sweep", counted)
    torch._dynamo.reset()
    counters.clear()
    try:
        with dev.cpu_flex_compile(), caplog.at_level(logging.INFO, logger="trainer.dflash.loop"):
            result = loop.train(cfg)
    finally:
        torch._dynamo.reset()
    lengths = [len(ids) for ids, _ in _rows()]
    loader = BucketBatchSampler(lengths, batch_size=3, seed=cfg.seed, boundaries=bucket_bounds(lengths, 192))
    assert swept == batch_shapes(loader.shapes(), 192) and {n for _, n in swept} == {128, 192}
    assert result.step == result.total_steps >= 3
    progress = [r.getMessage() for r in caplog.records if r.getMessage().startswith("compile ")]
    n = len(swept)
    assert len(progress) == n and progress[-1].startswith(f"compile {n}/{n}: length 192")
    # 2 compiled functions (create_block_mask, flex_attention) x 2 mask kinds per shape, all before step 1
    assert graphs_after_sweep == [2 * 2 * len(swept)]
    assert counters["stats"]["unique_graphs"] == graphs_after_sweep[0], dict(counters["stats"])
    assert not counters["graph_break"]
