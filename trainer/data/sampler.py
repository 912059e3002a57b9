"""Bucketed shuffle batch sampler with exact mid-epoch resume.

Rows are grouped into length buckets (upper bounds on a geometric grid rounded to `bucket_multiple`),
so a batch pads to its bucket's bound: little padding, and few distinct padded lengths (fla's kernels
autotune per shape). Every epoch the members of every bucket are re-shuffled with a generator seeded
by (seed, epoch) before they are cut into batches, and the batches of all buckets are shuffled
together: the composition of each batch changes every epoch, and is the same on a resume.

Batching is by count (`batch_size`) or by token budget (`max_tokens`: rows per batch = max_tokens //
bucket bound, at least 1, so a batch never exceeds the budget once padded to its bound, unless a single
row does). With `world_size > 1` each rank takes every world_size-th batch; the batch list is padded by
repeating its first batches so every rank gets the same count (`drop_last=True` drops instead).

`state_dict()` records (epoch, batches already yielded); `load_state_dict()` then `__iter__` yields
exactly the remaining batches of that epoch.
"""
from __future__ import annotations

import bisect
import hashlib
import random
from collections.abc import Iterator, Sequence
from typing import Any


def default_boundaries(max_len: int, multiple: int = 64, ratio: float = 1.15) -> list[int]:
    """Bucket upper bounds: multiples of `multiple` growing by ~`ratio`; the last one is `max_len` itself
    (rows are never padded past the longest row, e.g. data.max_length)."""
    bounds: list[int] = []
    b = multiple
    while b < max_len:
        bounds.append(b)
        b = max(b + multiple, int(b * ratio) // multiple * multiple)
    bounds.append(max_len)
    return bounds


def _fingerprint(lengths: Sequence[int]) -> str:
    h = hashlib.blake2b(digest_size=8)
    h.update(len(lengths).to_bytes(8, "little"))
    for n in lengths[:: max(1, len(lengths) // 4096)]:
        h.update(int(n).to_bytes(4, "little"))
    return h.hexdigest()


class BucketBatchSampler:
    """Iterable of index lists drawn from length buckets; reshuffled per epoch; resumable mid-epoch."""

    def __init__(
        self, lengths: Sequence[int], *, batch_size: int | None = None, max_tokens: int | None = None,
        seed: int = 0, rank: int = 0, world_size: int = 1, boundaries: Sequence[int] | None = None,
        drop_last: bool = False,
    ) -> None:
        if (batch_size is None) == (max_tokens is None):
            raise ValueError("BucketBatchSampler: give exactly one of batch_size or max_tokens")
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"BucketBatchSampler: batch_size must be >= 1, got {batch_size}")
        if max_tokens is not None and max_tokens < 1:
            raise ValueError(f"BucketBatchSampler: max_tokens must be >= 1, got {max_tokens}")
        if not 0 <= rank < world_size:
            raise ValueError(f"BucketBatchSampler: rank {rank} not in [0, world_size={world_size})")
        if not lengths:
            raise ValueError("BucketBatchSampler: no rows (lengths is empty)")
        self.lengths = list(lengths)
        self.batch_size, self.max_tokens = batch_size, max_tokens
        self.seed, self.rank, self.world_size, self.drop_last = seed, rank, world_size, drop_last
        self.boundaries = sorted(boundaries) if boundaries else default_boundaries(max(self.lengths))
        if self.boundaries[-1] < max(self.lengths):
            self.boundaries.append(max(self.lengths))
        self.buckets: list[list[int]] = [[] for _ in self.boundaries]
        for i, n in enumerate(self.lengths):
            self.buckets[bisect.bisect_left(self.boundaries, n)].append(i)
        self.epoch = 0
        self.position = 0  # batches of this epoch already yielded on this rank
        self._fingerprint = _fingerprint(self.lengths)

    def rows_per_batch(self, bucket: int) -> int:
        if self.batch_size is not None:
            return self.batch_size
        assert self.max_tokens is not None
        return max(1, self.max_tokens // self.boundaries[bucket])

    def pad_to(self, batch: Sequence[int]) -> int:
        """The padded length of `batch`: its bucket's upper bound (few distinct shapes)."""
        longest = max(self.lengths[i] for i in batch)
        return self.boundaries[bisect.bisect_left(self.boundaries, longest)]

    def _all_batches(self, epoch: int) -> list[list[int]]:
        rng = random.Random(self.seed * 1_000_003 + epoch)
        batches: list[list[int]] = []
        for b, members in enumerate(self.buckets):
            if not members:
                continue
            order = members[:]
            rng.shuffle(order)
            k = self.rows_per_batch(b)
            batches.extend(order[i : i + k] for i in range(0, len(order), k))
        rng.shuffle(batches)
        return batches

    def _rank_batches(self, epoch: int) -> list[list[int]]:
        batches = self._all_batches(epoch)
        ws = self.world_size
        if ws > 1:
            if self.drop_last:
                batches = batches[: len(batches) // ws * ws]
            elif len(batches) % ws:
                need = ws - len(batches) % ws
                batches = batches + [batches[i % len(batches)] for i in range(need)]
        return batches[self.rank :: ws]

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch; changing it restarts at its first batch (a resume keeps its position)."""
        if epoch != self.epoch:
            self.epoch, self.position = epoch, 0

    def __len__(self) -> int:
        n = sum(-(-len(m) // self.rows_per_batch(b)) for b, m in enumerate(self.buckets) if m)
        ws = self.world_size
        return (n // ws) if self.drop_last else -(-n // ws)

    def __iter__(self) -> Iterator[list[int]]:
        batches = self._rank_batches(self.epoch)
        while self.position < len(batches):
            batch = batches[self.position]
            self.position += 1
            yield batch
        self.position = 0
        self.epoch += 1  # a plain `for epoch: for batch in sampler` loop gets a new composition

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed,
                "world_size": self.world_size, "rank": self.rank, "fingerprint": self._fingerprint}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("fingerprint") != self._fingerprint:
            raise ValueError("BucketBatchSampler.load_state_dict: the state is for a different dataset "
                             "(row count/lengths differ)")
        for key in ("seed", "world_size"):
            if state.get(key) != getattr(self, key):
                raise ValueError(f"BucketBatchSampler.load_state_dict: {key} {state.get(key)!r} != "
                                 f"{getattr(self, key)!r} of this sampler")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
