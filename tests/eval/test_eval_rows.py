"""Which rows eval scores: a seeded permutation of the eval shards, not their first rows in file order."""
from __future__ import annotations

from trainer.eval.acceptance import eval_rows


def test_eval_draws_a_seeded_sample_spread_over_the_shards() -> None:
    rows = eval_rows(1000, 64, seed=1234)
    assert rows == eval_rows(1000, 64, seed=1234)  # every checkpoint of a run is scored on the same rows
    assert len(set(rows)) == 64 and rows == sorted(rows) and all(0 <= i < 1000 for i in rows)
    assert rows != list(range(64)) and max(rows) > 500  # not the first rows in file order
    assert eval_rows(1000, 64, seed=1) != rows


def test_eval_scores_every_row_when_it_asks_for_more_than_there_are() -> None:
    assert eval_rows(5, 64, seed=1234) == [0, 1, 2, 3, 4]
