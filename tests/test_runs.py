"""CI checks every shipped run: `python -m trainer check` (the real CLI) on each files/runs/*.yml, and on
the tests' own runs (tests/fixtures/runs/*.yml)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHIPPED = sorted((REPO / "files/runs").glob("*.yml"))
FIXTURES = sorted((REPO / "tests/fixtures/runs").glob("*.yml"))
RUNS = SHIPPED + FIXTURES


def test_the_production_runs_are_shipped() -> None:
    assert {"tiny", "qwen36-27b-dflash"} <= {p.stem for p in SHIPPED}
    assert "overfit" in {p.stem for p in FIXTURES}  # a test's run, kept out of files/runs


@pytest.mark.parametrize("run", RUNS, ids=[p.stem for p in RUNS])
def test_trainer_check_accepts_the_run(run: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "trainer", "check", str(run)], capture_output=True, text=True,
                       cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"ok (run {run.stem}," in r.stdout
