"""The drafter learns to draft for its target on conversations it never saw: a shortened `bench/learning.py`.

The bench's whole pipeline runs as a user runs it: a small Qwen3.5-architecture target trained on the
built-in language (walks over an ordering of made-up words), its own answers regenerated through
`generate` against the SGLang double in model mode (the target decodes each request), `prepare` with a
held-out split, `train` with CE, and `eval` on the held-out shards. A learning regression that leaves the
objective right (labels or anchors from the wrong source, a split leak, a schedule stuck in warm-up, an
eval scored on the wrong rows) brings the held-out tau back towards the untrained drafter's, and this
fails. Shorter than the bench's defaults (an ordering of 32 words, 500 target and 100 drafter steps), one loss
variant, no random-target row: one to two minutes on 2 cores.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_drafter_learns_its_target_on_heldout_conversations(tmp_path: Path) -> None:
    out = tmp_path / "learning"
    result_file = tmp_path / "learning.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "learning.py"), "--out", str(out), "--json", str(result_file),
         "--words", "32", "--target-steps", "500", "--steps", "100", "--variants", "CE", "--no-random-target",
         "--threads", str(min(2, os.cpu_count() or 1))],
        capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(result_file.read_text())
    rows = {r["row"]: r for r in result["rows"]}
    untrained, ce = rows["untrained drafter"], rows["CE"]

    # the target learned its language: otherwise no tau below would mean anything
    assert result["target_heldout_loss"] < 0.5, result
    # every row is scored on the held-out conversations, the same blocks for both
    assert untrained["split"] == ce["split"] == "heldout", rows
    assert untrained["blocks"] == ce["blocks"] > 100, rows
    # the untrained drafter accepts next to nothing; the trained one drafts several tokens per block
    assert untrained["tau"] < 1.3, rows
    assert ce["tau"] >= 2.0 and ce["tau"] >= untrained["tau"] + 1.0, rows
    # acceptance falls with the slot's distance from the anchor, and the first slot is mostly right
    assert ce["slot_acc"][0] > 0.5 and ce["slot_acc"][0] > ce["slot_acc"][-1], rows
    assert "| CE " in proc.stdout and "held-out tau" in proc.stdout
