"""Two-rank DDP through the real launcher: torchrun (c10d rendezvous on loopback) runs
`python -m trainer train` on 2 CPU processes with the gloo backend (NCCL's stand-in on CPU)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from dflash_factory import random_rows

from trainer.config import load_run_config


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_torchrun_two_ranks_gloo(make_run) -> None:
    path = make_run(rows=random_rows(8, 32, seed=3),
                    drafter={"max_anchors": 4, "block_size": 4},
                    train={"max_steps": 3, "save_every": 0, "batch_size": 1, "log_every": 1,
                           "placement": {"nproc_per_node": 2, "strategy": "ddp"}})
    cfg = load_run_config(path)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2",
           "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{_free_port()}",
           "-m", "trainer", "train", str(path)]
    rc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert rc.returncode == 0, rc.stderr[-3000:]
    meta = json.loads((cfg.run_path / "checkpoints" / "step-0000003" / "meta.json").read_text())
    assert meta["world_size"] == 2
    lines = [json.loads(x) for x in (cfg.run_path / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2, 3]  # rank 0 alone writes the metrics
    assert (cfg.run_path / "export" / "model.safetensors").is_file()
