"""Bucketed shuffle batch sampler: rank-balanced steps, exact mid-epoch resume, on any world size.

Rows are grouped into length buckets (upper bounds on a geometric grid rounded to `bucket_multiple`),
so a batch pads to its bucket's bound: little padding, and few distinct padded lengths (fla's kernels
autotune per shape, flex attention compiles per shape). Every epoch the members of every bucket are
re-shuffled with a generator seeded by (seed, epoch) before they are cut into batches: the composition
of each batch changes every epoch, and is the same on a resume.

Batching is by count (`batch_size`) or by token budget (`max_tokens`: rows per batch = max_tokens //
bucket bound, at least 1, so a batch never exceeds the budget once padded to its bound, unless a single
row does).

Rank-balanced steps: the batches of each bucket are cut into groups of `world_size` consecutive batches,
the groups of all buckets are shuffled together, and rank r takes batch r of every group. All ranks of
one step therefore work on the same padded length, and no rank waits for another's longer bucket. A
bucket whose batch count is not a multiple of world_size completes its last group by repeating its own
first batches (`drop_last=True` drops that group instead).

Resume: `state_dict()` records (epoch, groups already yielded, world size, what the epoch's plan
started from). On the same world size `load_state_dict()` then `__iter__` yields exactly the remaining
batches. On another world size the batches each bucket has left are regrouped for the new size: every
batch of the epoch is still drawn exactly once (padding repeats aside), in another order.
"""
from __future__ import annotations

import bisect
import hashlib
import logging
import random
from collections.abc import Iterator, Sequence
from typing import Any

log = logging.getLogger(__name__)


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


# one step of the plan: (bucket, index of its first batch in the bucket's list) -> world_size batches
Group = tuple[int, int]


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
        self.position = 0  # groups (steps) of this epoch's plan already yielded
        self.base: list[int] = []  # batches per bucket consumed before this epoch's plan began ([] = none)
        # batches of the whole run yielded so far, over all ranks and epochs (padding repeats not counted):
        # the same count whatever the world size, so the run's progress (schedule, noise) is the same curve
        # on any number of ranks and across a resume on another one
        self.batches_done = 0
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

    def _bucket_batches(self, epoch: int) -> list[list[list[int]]]:
        """Each bucket's batches for `epoch` (independent of the world size)."""
        rng = random.Random(self.seed * 1_000_003 + epoch)
        out: list[list[list[int]]] = []
        for b, members in enumerate(self.buckets):
            order = members[:]
            rng.shuffle(order)
            k = self.rows_per_batch(b)
            out.append([order[i : i + k] for i in range(0, len(order), k)])
        return out

    def _groups(self, epoch: int, base: Sequence[int]) -> list[Group]:
        """The epoch's steps: groups of world_size batches of one bucket, from batch base[b] on, shuffled."""
        ws = self.world_size
        order: list[int] = []  # one bucket id per step
        for b, batches in enumerate(self._bucket_batches(epoch)):
            left = len(batches) - (base[b] if base else 0)
            order.extend([b] * (left // ws if self.drop_last else -(-left // ws)))
        salt = "" if not any(base) else ",".join(map(str, base))
        random.Random(f"{self.seed}:{epoch}:{ws}:{salt}").shuffle(order)
        # a bucket's steps take its (already shuffled) batches front to back, so what an epoch has
        # consumed is a count per bucket: the state a resume on another world size starts from
        nxt = list(base) if base else [0] * len(self.buckets)
        groups: list[Group] = []
        for b in order:
            groups.append((b, nxt[b]))
            nxt[b] += ws
        return groups

    def _rank_batches(self, epoch: int, base: Sequence[int] = ()) -> list[list[int]]:
        """This rank's batch of every step of the epoch's plan."""
        return [batch for batch, _ in self._plan(epoch, base)]

    def _plan(self, epoch: int, base: Sequence[int] = ()) -> list[tuple[list[int], int]]:
        """(this rank's batch, the step's real batches over all ranks) for every step of the epoch's plan;
        a group at the end of a bucket holds fewer real batches than ranks (the rest repeat earlier ones)."""
        per_bucket = self._bucket_batches(epoch)
        out = []
        for b, first in self._groups(epoch, base):
            batches = per_bucket[b]
            i = first + self.rank
            out.append((batches[i] if i < len(batches) else batches[(i - len(batches)) % len(batches)],
                        min(len(batches), first + self.world_size) - first))
        return out

    @property
    def batches_per_epoch(self) -> int:
        """Real batches of one epoch over all ranks (without drop_last, the same for any world size)."""
        ws = self.world_size
        n = 0
        for b, m in enumerate(self.buckets):
            batches = -(-len(m) // self.rows_per_batch(b))
            n += (batches // ws) * ws if self.drop_last else batches
        return n

    def consumed(self) -> list[int]:
        """Batches of each bucket this epoch has yielded so far (padding repeats not counted)."""
        per_bucket = self._bucket_batches(self.epoch)
        done = list(self.base) if self.base else [0] * len(per_bucket)
        for b, first in self._groups(self.epoch, self.base)[: self.position]:
            done[b] = min(len(per_bucket[b]), first + self.world_size)
        return done

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch; changing it restarts at its first batch (a resume keeps its position)."""
        if epoch != self.epoch:
            self.epoch, self.position, self.base = epoch, 0, []
            self.batches_done = epoch * self.batches_per_epoch

    def __len__(self) -> int:
        """Steps (batches per rank) in a whole epoch."""
        ws = self.world_size
        n = 0
        for b, m in enumerate(self.buckets):
            batches = -(-len(m) // self.rows_per_batch(b))
            n += batches // ws if self.drop_last else -(-batches // ws)
        return n

    def shapes(self) -> set[tuple[int, int]]:
        """The (rows, padded length) pairs a batch can have: each bucket's full batch and its last one.
        What the compiled kernels see (one compilation each), whatever the epoch's order."""
        out = set()
        for b, members in enumerate(self.buckets):
            if members:
                k = self.rows_per_batch(b)
                out.add((min(k, len(members)), self.boundaries[b]))
                if len(members) > k and len(members) % k:
                    out.add((len(members) % k, self.boundaries[b]))
        return out

    def remaining(self) -> int:
        """Steps left in the current epoch."""
        return len(self._groups(self.epoch, self.base)) - self.position

    def __iter__(self) -> Iterator[list[int]]:
        plan = self._plan(self.epoch, self.base)
        while self.position < len(plan):
            batch, real = plan[self.position]
            self.position += 1
            self.batches_done += real
            yield batch
        self.position, self.base = 0, []
        self.epoch += 1  # a plain `for epoch: for batch in sampler` loop gets a new composition

    def _count_done(self) -> None:
        """`batches_done` of a restored state: whole epochs, plus what this one consumed per bucket."""
        self.batches_done = self.epoch * self.batches_per_epoch + sum(self.consumed())

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "base": list(self.base),
                "consumed": self.consumed(), "world_size": self.world_size, "rank": self.rank,
                "fingerprint": self._fingerprint}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("fingerprint") != self._fingerprint:
            raise ValueError("BucketBatchSampler.load_state_dict: the state is for a different dataset "
                             "(row count/lengths differ)")
        if state.get("seed") != self.seed:
            raise ValueError(f"BucketBatchSampler.load_state_dict: seed {state.get('seed')!r} != "
                             f"{self.seed!r} of this sampler")
        self.epoch = int(state["epoch"])
        if state.get("world_size") == self.world_size:
            self.position, self.base = int(state["position"]), list(state.get("base", []))
            self._count_done()
            return
        if "consumed" not in state:
            raise ValueError(f"BucketBatchSampler.load_state_dict: the state was saved with world_size "
                             f"{state.get('world_size')} by an older version that cannot be regrouped for "
                             f"world_size {self.world_size}")
        # another world size: regroup what each bucket has left of this epoch for the new size
        self.position, self.base = 0, [int(x) for x in state["consumed"]]
        self._count_done()
        if self.rank == 0:
            log.info("sampler: resuming epoch %d on %d rank(s) (saved on %s): %d batches of the epoch "
                     "done, the rest regrouped", self.epoch, self.world_size, state.get("world_size"),
                     sum(self.base))
