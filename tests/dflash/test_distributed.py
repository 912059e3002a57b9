"""Two ranks through the real launcher: torchrun (c10d rendezvous on loopback) runs the trainer's CLI
(`trainer train`, through tests/dflash/stop_after.py, which stops it after 3 steps) on 2 CPU processes
with the gloo backend (NCCL's stand-in on CPU), the drafter sharded by FSDP2.

The meter is checked against the data: the tokens and samples the run reports equal those of the batches
the samplers handed out. The 2-rank checkpoint is then resumed on 1 rank, which finishes the epoch: every
row of the epoch is trained on (only padding batches repeat), and the learning rate goes on along the curve
of an uninterrupted 1-rank run."""
from __future__ import annotations

import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from dflash_factory import random_rows

from trainer.config import load_run_config
from trainer.data.sampler import BucketBatchSampler
from trainer.dflash.loop import train
from trainer.layout import RunLayout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(path: Path, *overrides: str, stop_after: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2",
           "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{_free_port()}",
           str(Path(__file__).with_name("stop_after.py")), str(stop_after),
           "train", str(path), *[a for o in overrides for a in ("--set", o)]]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_two_ranks_fsdp_count_each_token_once_then_resume_on_one_rank(make_run) -> None:
    rows = random_rows(22, 40, seed=3)  # lengths 40, 36 and 32
    max_length = 34  # rows are cut to 34 tokens: the meter counts what is trained on
    path = make_run(rows=rows, data={"max_length": max_length},
                    drafter={"max_anchors": 4, "block_size": 4},
                    train={"epochs": 1, "max_steps": 0, "save_every": 0, "batch_size": 2, "log_every": 2,
                           "warmup_ratio": 0.2, "min_lr_ratio": 0.1,
                           "placement": {"nproc_per_node": 2, "strategy": "fsdp"}})
    cfg = load_run_config(path)
    run_path = RunLayout.of(cfg).root
    rc = _torchrun(path, stop_after=3)
    assert rc.returncode == 0, rc.stderr[-3000:]
    meta = json.loads((run_path / "checkpoints" / "step-0000003" / "meta.json").read_text())
    assert meta["world_size"] == 2 and meta["strategy"] == "fsdp"
    two = _metrics(run_path)
    assert [x["step"] for x in two] == [1, 2, 3]  # rank 0 alone writes the metrics

    lengths = [len(ids) for ids, _ in rows]
    samplers = [BucketBatchSampler(lengths, batch_size=2, seed=cfg.seed, rank=r, world_size=2)
                for r in (0, 1)]
    per_rank = [list(itertools.islice(iter(s), 3)) for s in samplers]
    for step, line in enumerate(two):
        batches = [per_rank[r][step] for r in (0, 1)]
        assert line["samples"] == sum(len(b) for b in batches)
        assert line["tokens"] == sum(min(lengths[i], max_length) for b in batches for i in b)
        assert line["step_time_s"] > 0 and line["total_steps"] == len(samplers[0])
    assert "tokens_per_s" in two[1] and "samples_per_s" in two[1] and two[1]["mfu"] is None  # CPU: no peak
    assert two[1]["tokens_per_s"] == pytest.approx(
        (two[0]["tokens"] + two[1]["tokens"]) / (two[0]["step_time_s"] + two[1]["step_time_s"]), rel=0.05)

    # the same run on 1 rank (one process, no wrapper): resumes the 2-rank checkpoint and ends the epoch
    one_cfg = load_run_config(path, ["train.placement.nproc_per_node=1"])
    result = train(one_cfg, resume=True)
    lines = _metrics(run_path)
    assert [x["step"] for x in lines[:3]] == [1, 2, 3] and lines[:3] == two
    one = lines[3:]
    assert result.step == 3 + len(one) == result.total_steps and one
    state = samplers[0].state_dict()  # after 3 steps of 2 ranks, what each bucket has consumed
    rest = BucketBatchSampler(lengths, batch_size=2, seed=cfg.seed)
    rest.load_state_dict(state)
    left = list(rest)
    assert [x["samples"] for x in one] == [len(b) for b in left]
    assert sum(x["tokens"] for x in one) == sum(min(lengths[i], max_length) for b in left for i in b)
    trained = {i for b in left for i in b} | {i for r in per_rank for b in r for i in b}
    assert trained == set(range(len(rows)))  # every row of the epoch, across the change of world size
    assert (run_path / "export" / "model.safetensors").is_file()

    # the schedule follows the batches consumed over all ranks, not a step count: after the change of
    # world size each step runs at the lr of the step of an uninterrupted 1-rank run that ends at the
    # same point of the run (the noise annealing reads the same progress)
    plain_dir = run_path.parent / "plain"
    shutil.copytree(run_path / "shards", plain_dir / "shards")
    train(load_run_config(path, ["train.placement.nproc_per_node=1", f"run_dir={plain_dir}"]))
    plain = {x["progress"]: x["lr"] for x in _metrics(plain_dir)}
    assert len(one) >= 3 and two[-1]["progress"] < one[0]["progress"]
    for x in one:
        assert x["lr"] == pytest.approx(plain[x["progress"]], rel=1e-6, abs=1e-12), (x, plain)
