"""Length buckets of the train loader and eval: their bounds, and the batch shapes they produce.

A batch is right-padded to its bucket's bound (capped at data.max_length), so the padded lengths come from
a small fixed set: flex attention and fla's kernels compile or autotune once per shape. The bounds are
multiples of flex attention's 128-token tile (`TILE`): inductor's flex kernel skips its bounds-checked
loads only when it can prove the sequence length divides by 128, and a bound that is not a multiple wastes
the rest of its last tile anyway.

Two exceptions, both at the top: the longest bucket is data.max_length itself when that is not a multiple
of 128 (rows are never padded past it), and a run whose rows all fit in one tile (longest <= 128) has one
bucket, the longest padded length, whatever it is. Set data.max_length to a multiple of 128 to keep every
bucket tile-aligned.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

TILE = 128  # flex attention's default block (BLOCK_M = BLOCK_N = 128)


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def bucket_bounds(lengths: Sequence[int], max_length: int = 0, tile: int = TILE) -> list[int]:
    """Bucket upper bounds for rows of `lengths` (their length before data.max_length cuts them).

    Multiples of `tile` growing by about 15 % (the sampler's grid), up to the longest padded length:
    min(longest row rounded up to `tile`, `max_length`); one bucket, the longest row, when it fits in
    one tile. The last bound is raised to the longest row when
    rows are longer than `max_length` (they are cut to it, and their bucket still pads to `max_length`),
    so every row has a bucket. `max_length` 0: no cap.
    """
    from trainer.data.sampler import default_boundaries

    if not lengths:
        raise ValueError("bucket_bounds: no rows")
    longest = max(lengths)
    if longest <= tile:  # one tile holds every row: one bucket, no padding past the longest row
        return [longest]
    cap = round_up(longest, tile)
    if max_length > 0:
        cap = min(cap, max_length)
    bounds = [cap] if cap <= tile else default_boundaries(cap, multiple=tile)
    bounds[-1] = max(bounds[-1], longest)
    return bounds


def padded_length(bound: int, max_length: int = 0) -> int:
    """The length a batch of the bucket with this bound is padded to (collate caps it at data.max_length)."""
    return min(bound, max_length) if max_length > 0 else bound


def batch_shapes(shapes: Iterable[tuple[int, int]], max_length: int = 0) -> list[tuple[int, int]]:
    """The distinct (rows, padded length) of the sampler's (rows, bucket bound) pairs, shortest first."""
    return sorted({(rows, padded_length(bound, max_length)) for rows, bound in shapes},
                  key=lambda s: (s[1], s[0]))
