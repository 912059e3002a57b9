"""CI checks every shipped run: `python -m trainer check` (the real CLI) on each files/runs/*.yml."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RUNS = sorted((REPO / "files/runs").glob("*.yml"))


def test_the_production_runs_are_shipped() -> None:
    assert {"tiny", "overfit", "qwen36-27b-dflash"} <= {p.stem for p in RUNS}


@pytest.mark.parametrize("run", RUNS, ids=[p.stem for p in RUNS])
def test_trainer_check_accepts_the_run(run: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "trainer", "check", str(run)], capture_output=True, text=True,
                       cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"ok (run {run.stem}," in r.stdout
