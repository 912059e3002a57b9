"""BucketBatchSampler: every row once per epoch, new batch compositions each epoch, exact resume."""
from __future__ import annotations

import random

import pytest

from trainer.data.sampler import BucketBatchSampler

_RNG = random.Random(7)
LENGTHS = [_RNG.randint(20, 3000) for _ in range(997)]


def _epoch(s: BucketBatchSampler, epoch: int) -> list[list[int]]:
    s.set_epoch(epoch)
    return list(s)


@pytest.mark.parametrize("kw", [{"batch_size": 8}, {"max_tokens": 16384}])
def test_every_row_exactly_once_per_epoch(kw: dict[str, int]) -> None:
    s = BucketBatchSampler(LENGTHS, seed=3, **kw)
    for e in range(3):
        batches = _epoch(s, e)
        flat = [i for b in batches for i in b]
        assert sorted(flat) == list(range(len(LENGTHS)))
        assert len(batches) == len(s)


def test_batch_composition_changes_between_epochs_and_is_seeded() -> None:
    s = BucketBatchSampler(LENGTHS, batch_size=8, seed=3)
    e0, e1 = _epoch(s, 0), _epoch(s, 1)
    sets0 = {frozenset(b) for b in e0}
    sets1 = {frozenset(b) for b in e1}
    assert len(sets0 & sets1) < 0.05 * len(sets0)  # membership re-drawn, not just the order
    again = BucketBatchSampler(LENGTHS, batch_size=8, seed=3)
    assert _epoch(again, 1) == e1  # (seed, epoch) determine the epoch
    other = BucketBatchSampler(LENGTHS, batch_size=8, seed=4)
    assert _epoch(other, 1) != e1


def test_plain_loop_without_set_epoch_still_reshuffles() -> None:
    s = BucketBatchSampler(LENGTHS, batch_size=8, seed=0)
    assert list(s) != list(s)


def test_low_padding_and_few_distinct_shapes() -> None:
    s = BucketBatchSampler(LENGTHS, batch_size=8, seed=1)
    batches = _epoch(s, 0)
    padded = sum(s.pad_to(b) * len(b) for b in batches)
    real = sum(LENGTHS)
    assert padded / real < 1.25
    shuffled = list(range(len(LENGTHS)))
    random.Random(0).shuffle(shuffled)
    naive = sum(max(LENGTHS[i] for i in shuffled[k:k + 8]) * len(shuffled[k:k + 8])
                for k in range(0, len(shuffled), 8))
    assert padded < 0.7 * naive
    assert len({s.pad_to(b) for b in batches}) <= len(s.boundaries) < 40
    for b in batches:
        assert max(LENGTHS[i] for i in b) <= s.pad_to(b)


def test_token_budget() -> None:
    s = BucketBatchSampler(LENGTHS, max_tokens=12000, seed=2)
    for b in _epoch(s, 0):
        assert s.pad_to(b) * len(b) <= 12000
    huge = BucketBatchSampler([50, 60, 9000], max_tokens=4096)
    assert sorted(map(len, _epoch(huge, 0))) == [1, 2]  # an over-budget row still gets its own batch


def test_resume_mid_epoch_reproduces_the_remaining_order() -> None:
    s = BucketBatchSampler(LENGTHS, max_tokens=16384, seed=11)
    s.set_epoch(2)
    full = list(BucketBatchSampler(LENGTHS, max_tokens=16384, seed=11)._rank_batches(2))
    it = iter(s)
    seen = [next(it) for _ in range(17)]
    state = s.state_dict()
    assert state["epoch"] == 2 and state["position"] == 17
    fresh = BucketBatchSampler(LENGTHS, max_tokens=16384, seed=11)
    fresh.load_state_dict(state)
    fresh.set_epoch(2)  # a train loop that calls set_epoch on resume keeps the position
    rest = list(fresh)
    assert seen + rest == full
    assert fresh.state_dict()["epoch"] == 3 and fresh.state_dict()["position"] == 0


def test_resume_refuses_other_data_or_seed() -> None:
    state = BucketBatchSampler(LENGTHS, batch_size=4, seed=1).state_dict()
    with pytest.raises(ValueError, match="different dataset"):
        BucketBatchSampler(LENGTHS[:-1], batch_size=4, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="seed"):
        BucketBatchSampler(LENGTHS, batch_size=4, seed=2).load_state_dict(state)


def test_ranks_partition_the_epoch() -> None:
    ranks = [BucketBatchSampler(LENGTHS, batch_size=8, seed=5, rank=r, world_size=3) for r in range(3)]
    per_rank = [_epoch(s, 1) for s in ranks]
    assert len({len(b) for b in per_rank}) == 1 and len(per_rank[0]) == len(ranks[0])
    flat = [i for batches in per_rank for b in batches for i in b]
    assert set(flat) == set(range(len(LENGTHS)))
    # only the padding batches repeat: at most world_size - 1 per non-empty bucket
    buckets = sum(1 for m in ranks[0].buckets if m)
    assert len(flat) - len(LENGTHS) <= (3 - 1) * 8 * buckets
    dropped = [BucketBatchSampler(LENGTHS, batch_size=8, seed=5, rank=r, world_size=3, drop_last=True)
               for r in range(3)]
    flat = [i for s in dropped for b in _epoch(s, 1) for i in b]
    assert len(flat) == len(set(flat))


@pytest.mark.parametrize(("kw", "msg"), [
    ({}, "exactly one of"), ({"batch_size": 2, "max_tokens": 10}, "exactly one of"),
    ({"batch_size": 0}, "batch_size"), ({"batch_size": 1, "rank": 2, "world_size": 2}, "rank 2"),
])
def test_bad_arguments(kw: dict[str, int], msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        BucketBatchSampler(LENGTHS, **kw)


def test_boundaries_never_pad_past_the_longest_row() -> None:
    from trainer.data.sampler import default_boundaries

    b = default_boundaries(4096)
    assert b[-1] == 4096 and b == sorted(set(b)) and all(x % 64 == 0 for x in b)
    s = BucketBatchSampler([4096, 4000, 100, 30], batch_size=2)
    assert max(s.pad_to([i]) for i in range(4)) == 4096
    assert default_boundaries(10) == [10]


def test_the_ranks_of_one_step_share_a_bucket() -> None:
    ranks = [BucketBatchSampler(LENGTHS, max_tokens=16384, seed=5, rank=r, world_size=4) for r in range(4)]
    per_rank = [_epoch(s, 2) for s in ranks]
    for step in zip(*per_rank, strict=True):
        assert len({ranks[0].pad_to(b) for b in step}) == 1  # one padded length per step: nobody waits


@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 3), (4, 2)])
def test_resume_on_another_world_size_draws_each_batch_once(before: int, after: int) -> None:
    kw = {"batch_size": 8, "seed": 9}
    old = [BucketBatchSampler(LENGTHS, rank=r, world_size=before, **kw) for r in range(before)]
    its = [iter(s) for s in old]
    done = [next(it) for _ in range(11) for it in its]
    state = old[0].state_dict()
    assert state["epoch"] == 0 and state["position"] == 11
    new = [BucketBatchSampler(LENGTHS, rank=r, world_size=after, **kw) for r in range(after)]
    for s in new:
        s.load_state_dict(state)
    rest = [b for s in new for b in s]
    assert all(s.epoch == 1 for s in new)
    rows = [i for b in done + rest for i in b]
    assert set(rows) == set(range(len(LENGTHS)))  # nothing of the epoch skipped
    buckets = sum(1 for m in new[0].buckets if m)
    assert len(rows) - len(LENGTHS) <= 8 * buckets * (before + after)  # only padding repeats
    # a second resume inside the regrouped plan continues it exactly
    again = BucketBatchSampler(LENGTHS, rank=0, world_size=after, **kw)
    again.load_state_dict(state)
    it = iter(again)
    first = [next(it) for _ in range(3)]
    mid = BucketBatchSampler(LENGTHS, rank=0, world_size=after, **kw)
    mid.load_state_dict(again.state_dict())
    assert first + list(mid) == list(BucketBatchSampler(LENGTHS, rank=0, world_size=after, **kw)
                                      ._rank_batches(0, state["consumed"]))


@pytest.mark.parametrize("kw", [{"batch_size": 8}, {"max_tokens": 16384}])
def test_shapes_cover_every_batch_of_every_epoch(kw: dict[str, int]) -> None:
    s = BucketBatchSampler(LENGTHS, seed=4, world_size=2, **kw)
    shapes = s.shapes()
    seen = {(len(b), s.pad_to(b)) for e in range(3) for b in _epoch(s, e)}
    assert seen <= shapes and len(shapes) <= 2 * len(s.boundaries)  # what the compile budget is sized by
