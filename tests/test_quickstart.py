"""`python -m trainer quickstart DIR`: the first run on a CPU, without Ansible or SGLang."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

from trainer.config import load_run_config
from trainer.quickstart import COMPLETIONS

REPO = Path(__file__).resolve().parents[1]


def test_the_bundled_completions_are_in_the_package() -> None:
    lines = COMPLETIONS.read_text().splitlines()
    assert len(lines) == 64 and all(json.loads(line)["messages"][-1]["role"] == "assistant" for line in lines)
    assert "quickstart_data/*.jsonl" in (REPO / "pyproject.toml").read_text()


def test_quickstart_runs_prepare_train_eval_and_prints_tau(tmp_path: Path) -> None:
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "trainer", "quickstart", str(tmp_path)], cwd=REPO,
                       capture_output=True, text=True, timeout=300,
                       env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert p.returncode == 0, p.stderr[-3000:]
    assert time.monotonic() - t0 < 120
    last = p.stdout.strip().splitlines()[-1]
    assert last.startswith("quickstart: tau ")
    run_file = tmp_path / "quickstart.yml"
    cfg = load_run_config(run_file)
    assert cfg.stages == ("prepare", "train", "eval")
    result = json.loads((tmp_path / "run" / "eval" / "step-0000024.json").read_text())
    assert result["split"] == "heldout" and result["blocks"] > 0 and f"tau {result['tau_mean']:.3f}" in last
    assert yaml.safe_load(run_file.read_text())["name"] == "quickstart"
