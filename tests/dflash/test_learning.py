"""A drafter trained by the pipeline drafts for its target on conversations it never saw.

bench/learning.py made small: a tiny Qwen3.5 target trained on the built-in walk language (24 words), its
own greedy answers regenerated through the SGLang double in model mode, `prepare` with a held-out
split, `train` (CE) and `eval` on the held-out shards. The held-out tau must be clearly above the
untrained drafter's, scored by the same eval on the same blocks: a bug that leaves the objective right
and the learning wrong (labels or anchors from the wrong source, a split leak, a schedule stuck in
warm-up, eval on the wrong rows) fails here. The full-size numbers are the bench's (docs/learning.md).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_learning", ROOT / "bench" / "learning.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_heldout_tau_is_clearly_above_the_untrained_drafter(tmp_path: Path) -> None:
    bench = load_bench()
    args = bench.parse_args(["--out", str(tmp_path), "--words", "24", "--target-steps", "120",
                             "--steps", "40", "--variants", "CE", "--no-random-target",
                             "--eval-samples", "16", "--max-new-tokens", "40", "--max-length", "64"])
    result = bench.run(args)
    rows = {r["row"]: r for r in result["rows"]}
    untrained, trained = rows["untrained drafter"], rows["CE"]
    assert untrained["split"] == trained["split"] == "heldout"
    assert untrained["tau"] < 1.5, untrained
    assert trained["tau"] >= untrained["tau"] + 0.5, (trained, untrained)
    assert trained["slot_acc"][0] > untrained["slot_acc"][0] + 0.2, (trained, untrained)
