"""Length buckets: bounds on flex attention's 128-token tile, and the loader's batches padded to them."""
from __future__ import annotations

import random

import pytest

from trainer.data.sampler import BucketBatchSampler
from trainer.dflash.buckets import TILE, batch_shapes, bucket_bounds, padded_length
from trainer.dflash.step import collate


def test_bounds_are_multiples_of_the_tile() -> None:
    bounds = bucket_bounds([130, 900, 4096], 4096)
    assert bounds[0] == 128 and bounds[-1] == 4096 and len(bounds) > 10
    assert all(b % TILE == 0 for b in bounds) and bounds == sorted(set(bounds))
    # the longest row rounded up to a tile, below data.max_length
    assert bucket_bounds([130, 1000], 4096)[-1] == 1024
    assert all(b % TILE == 0 for b in bucket_bounds([130, 1000], 0))


def test_the_exceptions_at_the_top() -> None:
    # data.max_length not a multiple of 128: the last bucket is max_length itself, the others tiles
    bounds = bucket_bounds([200, 4000], 4000)
    assert bounds[-1] == 4000 and all(b % TILE == 0 for b in bounds[:-1])
    # every row fits in one tile: one bucket, the longest row (no padding to 128)
    assert bucket_bounds([20, 48, 33], 64) == [48]
    # rows longer than data.max_length: their bucket still pads to max_length (collate cuts them)
    bounds = bucket_bounds([100, 300], 200)
    assert bounds[-1] == 300 and padded_length(bounds[-1], 200) == 200 and bounds[:-1] == [128]


@pytest.mark.parametrize("max_length", [4096, 1000, 96])
def test_every_batch_the_loader_produces_is_tile_aligned(max_length: int) -> None:
    rng = random.Random(0)
    lengths = [rng.randrange(20, 1500) for _ in range(300)]
    if max_length < TILE:
        lengths = [min(n, 120) for n in lengths]
    sampler = BucketBatchSampler(lengths, batch_size=4, seed=0, boundaries=bucket_bounds(lengths, max_length))
    seen = set()
    for idx in sampler:
        batch = collate([{"input_ids": [1] * lengths[i], "loss_mask": [1] * lengths[i]} for i in idx],
                        pad_to=sampler.pad_to(idx), max_length=max_length)
        seen.add(tuple(batch.input_ids.shape))
    top = min(max(lengths), max_length)
    for _, s in seen:
        assert s % TILE == 0 or s == top, (s, seen)
    assert seen == set(batch_shapes(sampler.shapes(), max_length))  # what the compile sweep visits
