"""Kill-and-resume: the loss sequence of a resumed run equals the uninterrupted run's, bit for bit, on
CPU (anchors and noise come from per-micro-batch seeds; optimizer, scheduler, sampler and RNG states are
in the checkpoint). Also: atomic checkpoints, keep-last-K, the doctor gate."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dflash_factory import random_rows
from stop_after import stop_after

from trainer.config import load_run_config
from trainer.dflash import checkpoint as ckpt
from trainer.dflash.loop import train
from trainer.layout import RunLayout

RESUME_RUN = {
    "drafter": {"max_anchors": 4, "block_size": 4},
    "loss": {"ce_weight": 0.5, "kl_weight": 1.0, "dpace": True, "noise": "gaussian", "noise_std": 0.05},
    "train": {"max_steps": 8, "save_every": 2, "keep_last": 2, "grad_accum": 2, "batch_size": 2,
              "log_every": 4, "lr": 1e-3},
}


def _losses(run_dir: Path) -> list[tuple[int, float]]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(x["step"], x["loss"]) for x in lines]


def test_stop_and_resume_is_bit_exact(make_run, tmp_path: Path) -> None:
    rows = random_rows(6, 40, seed=1, prompt=5)
    ref_cfg = load_run_config(make_run(rows=rows, **RESUME_RUN), [f"run_dir={tmp_path}/ref"])
    import shutil

    shutil.copytree(tmp_path / "run" / "shards", tmp_path / "ref" / "shards")
    ref = train(ref_cfg)
    assert ref.step == 8

    cfg = load_run_config(make_run(rows=rows, **RESUME_RUN))
    with stop_after(5):
        part = train(load_run_config(make_run(rows=rows, **RESUME_RUN)))
    assert part.stopped_early and part.step == 5
    assert ckpt.latest_checkpoint(RunLayout.of(cfg).root / "checkpoints").name == "step-0000005"
    rest = train(cfg, resume=True)
    assert rest.step == 8
    assert _losses(RunLayout.of(cfg).root) == _losses(RunLayout.of(ref_cfg).root)  # exact float equality
    # keep_last=2: only the two newest step dirs survive
    kept = [p.name for p in ckpt.list_checkpoints(RunLayout.of(cfg).root / "checkpoints")]
    assert kept == ["step-0000006", "step-0000008"]


@pytest.mark.slow
def test_sigkill_then_resume_matches_uninterrupted(make_run, tmp_path: Path) -> None:
    """A real `kill -9` of `python -m trainer train` mid-run, then `--resume`."""
    rows = random_rows(6, 40, seed=2)
    run = {**RESUME_RUN, "train": {**RESUME_RUN["train"], "max_steps": 10, "save_every": 1}}
    path = make_run(rows=rows, **run)
    cfg = load_run_config(path)
    env = {**os.environ, "OMP_NUM_THREADS": "2", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen([sys.executable, "-m", "trainer", "train", str(path)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    root = RunLayout.of(cfg).root / "checkpoints"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        latest = ckpt.latest_checkpoint(root)
        if latest is not None and int(latest.name.split("-")[1]) >= 3:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = int(ckpt.latest_checkpoint(root).name.split("-")[1])
    assert killed_at < 10
    rc = subprocess.run([sys.executable, "-m", "trainer", "train", str(path), "--resume"], env=env,
                        capture_output=True, text=True, timeout=600)
    assert rc.returncode == 0, rc.stderr[-2000:]
    resumed = _losses(RunLayout.of(cfg).root)
    ref_cfg = load_run_config(path, [f"run_dir={tmp_path}/ref"])
    import shutil

    shutil.copytree(RunLayout.of(cfg).root / "shards", RunLayout.of(ref_cfg).root / "shards")
    train(ref_cfg)
    assert resumed == _losses(RunLayout.of(ref_cfg).root)


def test_refuses_data_the_doctor_did_not_pass(make_run) -> None:
    from trainer.data.shards import DataRefused

    cfg = load_run_config(make_run(doctor_passed=False, train={"max_steps": 1}))
    with pytest.raises(DataRefused, match="doctor refused"):
        train(cfg)
    cfg = load_run_config(make_run(doctor_passed=False, train={"max_steps": 1, "allow_unchecked_data": True}))
    assert train(cfg).step == 1


def test_interrupted_save_leaves_previous_checkpoint_latest(tmp_path: Path) -> None:
    import torch

    root = tmp_path / "checkpoints"
    w = {"fc.weight": torch.ones(2, 2)}
    ckpt.save_checkpoint(root, 1, weights=w, state={"step": 1}, meta={}, config={}, keep_last=3)
    (root / ".tmp-step-0000002-999").mkdir()  # a save killed before its rename
    (root / "step-0000003").mkdir()  # a step dir without meta.json (killed mid-write by hand)
    assert ckpt.latest_checkpoint(root).name == "step-0000001"
    weights, meta = ckpt.load_weights(ckpt.resolve_checkpoint(tmp_path))
    state, _meta = ckpt.load_state(ckpt.resolve_checkpoint(tmp_path))
    assert meta["step"] == 1 and state["step"] == 1 and torch.equal(weights["fc.weight"], w["fc.weight"])
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        ckpt.resolve_checkpoint(tmp_path / "elsewhere")
