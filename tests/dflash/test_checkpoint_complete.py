"""A checkpoint with a missing or cut-short file is never resumed from: files.json (written last) lists every
file of a step dir with its size, and `latest_checkpoint` passes over a step dir whose files do not match,
naming the file, for the newest complete one. Older step dirs without the list still count on meta.json."""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from dflash_factory import random_rows

from trainer.config import load_run_config
from trainer.dflash import checkpoint as ckpt
from trainer.dflash.loop import train
from trainer.layout import FILES_LIST, checkpoint_problem, latest_checkpoint


def _save(root: Path, step: int) -> Path:
    return ckpt.save_checkpoint(
        root, step, weights={"w": torch.full((64,), float(step))}, state={"step": step},
        meta={"epoch": 0}, config={"name": "c"}, keep_last=5, optimizer={"state": {"w": torch.zeros(64)}})


def test_the_saver_lists_every_file_with_its_size(tmp_path: Path) -> None:
    path = _save(tmp_path, 1)
    listed = json.loads((path / FILES_LIST).read_text())["files"]
    on_disk = {p.name: p.stat().st_size for p in path.iterdir() if p.name != FILES_LIST}
    assert listed == on_disk
    assert set(listed) == {"drafter.safetensors", "optimizer.pt", "state.pt", "config.yml", "meta.json"}
    assert checkpoint_problem(path) is None


@pytest.mark.parametrize("damage", ["delete", "truncate"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str) -> None:
    _save(tmp_path, 1)
    newest = _save(tmp_path, 2)
    assert latest_checkpoint(tmp_path) == newest
    opt = newest / "optimizer.pt"
    if damage == "delete":
        opt.unlink()
        why = "optimizer.pt is missing"
    else:
        size = opt.stat().st_size
        os.truncate(opt, size // 2)
        why = f"optimizer.pt has {size // 2} bytes, not {size}"
    with caplog.at_level(logging.WARNING, logger="trainer.layout"):
        assert latest_checkpoint(tmp_path) == tmp_path / "step-0000001"
    assert why in caplog.text and "step-0000002" in caplog.text
    assert checkpoint_problem(newest) == why
    # named explicitly, it is refused with the same reason rather than loaded
    with pytest.raises(ckpt.CheckpointError, match=f"step-0000002: incomplete checkpoint: {why}"):
        ckpt.resolve_checkpoint(newest)
    assert ckpt.resolve_checkpoint(tmp_path) == tmp_path / "step-0000001"


def test_no_complete_checkpoint_at_all_is_none(tmp_path: Path) -> None:
    only = _save(tmp_path, 3)
    (only / "drafter.safetensors").unlink()
    assert latest_checkpoint(tmp_path) is None
    (only / FILES_LIST).write_text("[1, 2]")  # a list that is not one: never taken as complete
    assert checkpoint_problem(only) is not None and "files.json cannot be read" in checkpoint_problem(only)


def test_an_older_checkpoint_without_the_list_is_still_accepted(tmp_path: Path) -> None:
    old = _save(tmp_path, 4)
    (old / FILES_LIST).unlink()
    (old / "optimizer.pt").unlink()  # nothing says it belonged there: meta.json decides, as before the list
    assert latest_checkpoint(tmp_path) == old
    (old / "meta.json").unlink()
    assert latest_checkpoint(tmp_path) is None


def test_keep_last_counts_only_complete_checkpoints_and_clears_old_fetch_leftovers(tmp_path: Path) -> None:
    """keep_last keeps that many checkpoints a resume can use: a damaged step dir does not take the
    place of a complete one; the hidden dir of a cut-short S3 fetch goes once a newer checkpoint is
    complete, one of a newer step stays (the next fetch resumes it)."""
    for step in (1, 2, 3):
        _save(tmp_path, step)
    (tmp_path / "step-0000003" / "optimizer.pt").unlink()  # damaged
    for leftover in (".fetch-step-0000002", ".fetch-step-0000009"):
        (tmp_path / leftover).mkdir()
        (tmp_path / leftover / "state.pt").write_bytes(b"part")
    ckpt.save_checkpoint(tmp_path, 4, weights={"w": torch.zeros(64)}, state={"step": 4}, meta={"epoch": 0},
                         config={"name": "c"}, keep_last=2)
    left = sorted(p.name for p in tmp_path.iterdir() if p.is_dir())
    assert left == [".fetch-step-0000009", "step-0000002", "step-0000004"]
    assert latest_checkpoint(tmp_path) == tmp_path / "step-0000004"


def test_resume_skips_the_checkpoint_that_lost_its_optimizer_state(
        make_run: Any, caplog: pytest.LogCaptureFixture) -> None:
    """train --resume: the newest step dir has lost optimizer.pt, so the run resumes from the one before
    (and trains on to the end) instead of failing on the missing file."""
    path = make_run(rows=random_rows(4, 32, seed=3), drafter={"max_anchors": 4, "block_size": 4},
                    train={"max_steps": 2, "save_every": 1, "keep_last": 3, "batch_size": 2})
    cfg = load_run_config(path)
    assert train(cfg).step == 2
    root = Path(cfg.run_dir) / "checkpoints"
    (root / "step-0000002" / "optimizer.pt").unlink()
    with caplog.at_level(logging.INFO):
        result = train(cfg, resume=True)
    assert result.step == 2
    assert "optimizer.pt is missing" in caplog.text
    assert f"resumed from {root / 'step-0000001'} at step 1" in caplog.text
    assert checkpoint_problem(root / "step-0000002") is None  # step 2 written anew, complete


_SAME_STEP = """
import os, sys, types, torch, torch.distributed as dist
from pathlib import Path
from trainer.dflash.checkpoint import CheckpointError
from trainer.dflash.device import Runtime
from trainer.dflash.loop import Trainer
dist.init_process_group("gloo")
rank = dist.get_rank()
rt = Runtime(torch.device("cpu"), torch.device("cpu"), rank, rank, 2)
for steps in ((4, 4), (6, 4)):
    me = types.SimpleNamespace(rt=rt, step=steps[rank], ckpt_root=Path("/run/checkpoints"))
    try:
        Trainer._check_same_step(me)
        line = f"{rank} {steps} ok"
    except CheckpointError as e:
        line = f"{rank} {steps} refused: {e}"
    os.write(1, (line + chr(10)).encode())  # one write per line: the two ranks share the pipe
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_ranks_that_resume_at_different_steps_are_refused(tmp_path: Path) -> None:
    """Two real gloo ranks (torchrun): at one step they go on; at steps 6 and 4 (one node's disk newer than
    the other's) every rank refuses, naming its step."""
    import socket
    import subprocess
    import sys

    script = tmp_path / "same_step.py"
    script.write_text(_SAME_STEP)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2",
                        "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", str(script)],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout
    assert "0 (4, 4) ok" in out and "1 (4, 4) ok" in out, out
    assert "0 (6, 4) refused: rank 0 resumes at step 6 but the ranks' steps differ (mean 5)" in out, out
    assert "1 (6, 4) refused: rank 1 resumes at step 4" in out, out
