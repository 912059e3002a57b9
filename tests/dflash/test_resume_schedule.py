"""A resume is the run file's run: the schedule follows the batches consumed (the same curve on any number of
ranks and across a resume on another one), and a run file edited since the checkpoint takes effect with a
log line naming each change, or is refused naming the field; it is never ignored."""
from __future__ import annotations

import itertools
import json
import logging
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml
from dflash_factory import random_rows

from trainer.config import load_run_config, to_dict
from trainer.config_yaml import ConfigError
from trainer.data.sampler import BucketBatchSampler
from trainer.dflash import resume_changes
from trainer.dflash.config import TrainConfig
from trainer.dflash.loop import train
from trainer.dflash.optim import ProgressSchedule, lr_multiplier
from trainer.layout import RunLayout

LENGTHS = [40 + (i * 37) % 300 for i in range(203)]


def _drain(s: BucketBatchSampler, steps: int) -> None:
    it = iter(s)
    for _ in range(steps):
        next(it)


@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_an_epoch_counts_the_same_batches_on_any_world_size(world: int) -> None:
    samplers = [BucketBatchSampler(LENGTHS, batch_size=4, seed=3, rank=r, world_size=world)
                for r in range(world)]
    for s in samplers:
        list(s)
    assert {s.batches_done for s in samplers} == {samplers[0].batches_per_epoch}
    assert samplers[0].batches_per_epoch == BucketBatchSampler(LENGTHS, batch_size=4).batches_per_epoch


def test_a_resume_on_another_world_size_keeps_the_batches_done() -> None:
    two = BucketBatchSampler(LENGTHS, batch_size=4, seed=3, rank=0, world_size=2)
    list(two)  # one whole epoch
    _drain(two, 7)
    done = two.batches_done
    assert done == two.batches_per_epoch + 14
    one = BucketBatchSampler(LENGTHS, batch_size=4, seed=3, rank=0, world_size=1)
    one.load_state_dict(two.state_dict())
    assert one.batches_done == done
    _drain(one, 3)
    assert one.batches_done == done + 3


def test_lr_multiplier_warms_up_then_follows_the_cosine() -> None:
    # 100 steps, 4 of warmup: step s runs at (s+1)/4 during warmup, then cos over the rest
    per_step = [lr_multiplier(s / 100, (s + 1) / 100, 0.04, 0.1) for s in range(100)]
    assert per_step[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert per_step[4] == pytest.approx(1.0)
    assert per_step[52] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert all(a >= b for a, b in itertools.pairwise(per_step[4:]))
    assert lr_multiplier(1.0, 1.0, 0.04, 0.1) == pytest.approx(0.1)


def test_the_schedule_reads_train_lr_betas_and_weight_decay_from_the_config() -> None:
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.AdamW([p], lr=1.0, betas=(0.9, 0.95), weight_decay=0.0)
    sched = ProgressSchedule(opt, TrainConfig(lr=2e-4, warmup_ratio=0.0, min_lr_ratio=0.0,
                                              betas=(0.8, 0.9), weight_decay=0.1))
    assert sched.set(0.0, 0.01) == pytest.approx(2e-4)
    sched.apply_hyperparameters()
    assert opt.param_groups[0]["lr"] == pytest.approx(2e-4)
    assert opt.param_groups[0]["betas"] == (0.8, 0.9) and opt.param_groups[0]["weight_decay"] == 0.1


def test_changes_refused_name_the_field_and_the_rest_are_logged(make_run: Callable[..., Path],
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    saved = to_dict(load_run_config(make_run()))
    edited = to_dict(load_run_config(make_run(), ["train.lr=5e-4", "loss.kl_weight=0.5",
                                                  "train.placement.nproc_per_node=2", "run_dir=/elsewhere"]))
    with caplog.at_level(logging.WARNING, logger="trainer.dflash.resume_changes"):
        found = resume_changes.check(saved, edited, "step-0000004")
    assert {k for k, _, _ in found} == {"train.lr", "loss.kl_weight"}  # placement and paths not compared
    assert "train.lr changed since step-0000004" in caplog.text
    for field, value in [("drafter.block_size", "4"), ("seed", "7"), ("train.batch_size", "3")]:
        other = to_dict(load_run_config(make_run(), [f"{field}={value}"]))
        with pytest.raises(ConfigError, match=rf"step-0000004 was trained with another {field} .*--fresh"):
            resume_changes.check(saved, other, "step-0000004")
    # max_anchors is a training setting, not the architecture
    anchors = to_dict(load_run_config(make_run(), ["drafter.max_anchors=2"]))
    assert [k for k, _, _ in resume_changes.check(saved, anchors, "x")] == ["drafter.max_anchors"]


EPOCH_RUN = {
    "drafter": {"max_anchors": 4, "block_size": 4},
    "train": {"max_steps": 0, "epochs": 2, "save_every": 3, "keep_last": 5, "batch_size": 1,
              "log_every": 1, "lr": 1e-3, "warmup_ratio": 0.2, "min_lr_ratio": 0.0},
}


def _lr_by_step(run_dir: Path) -> dict[int, float]:
    return {x["step"]: x["lr"] for x in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}


def test_an_edited_lr_takes_effect_on_resume(make_run: Callable[..., Path], tmp_path: Path,
                                             caplog: pytest.LogCaptureFixture) -> None:
    rows = random_rows(5, 40, seed=2, prompt=5)
    path = make_run(rows=rows, **EPOCH_RUN)
    cfg = load_run_config(path, ["train.max_steps=0"])
    from stop_after import stop_after

    with stop_after(4):
        train(cfg)
    root = RunLayout.of(cfg).root
    before = _lr_by_step(root)
    ref = tmp_path / "ref"
    shutil.copytree(root / "shards", ref / "shards")
    edited = load_run_config(path, ["train.lr=2e-3"])
    with caplog.at_level(logging.WARNING):
        train(edited, resume=True)
    assert "train.lr changed since" in caplog.text and "0.001 -> 0.002" in caplog.text
    after = _lr_by_step(root)
    uninterrupted = load_run_config(path, [f"run_dir={ref}"])
    train(uninterrupted)
    plain = _lr_by_step(ref)
    # the steps before the resume ran at the old rate, every step after it at twice the plain run's
    assert {s: before[s] for s in before} == {s: plain[s] for s in before}
    resumed = [s for s in after if s > max(before)]
    assert resumed and all(after[s] == pytest.approx(2 * plain[s], rel=1e-6) for s in resumed)


def test_a_refused_change_stops_the_resume_before_any_step(make_run: Callable[..., Path]) -> None:
    rows = random_rows(5, 40, seed=2, prompt=5)
    path = make_run(rows=rows, **EPOCH_RUN)
    from stop_after import stop_after

    with stop_after(3):
        train(load_run_config(path))
    root = RunLayout.of(load_run_config(path)).root
    lines = (root / "metrics.jsonl").read_text()
    with pytest.raises(ConfigError, match=r"trained with another drafter\.block_size"):
        train(load_run_config(path, ["drafter.block_size=8"]), resume=True)
    assert (root / "metrics.jsonl").read_text() == lines
    saved = yaml.safe_load(next(root.glob("checkpoints/step-*/config.yml")).read_text())
    assert saved["drafter"]["block_size"] == 4


def test_the_launcher_refuses_it_once_before_torchrun_starts(make_run: Callable[..., Path]) -> None:
    """`python -m trainer train RUN --resume` for a 2-rank run: one line, exit 2, no rank started."""
    rows = random_rows(5, 40, seed=2, prompt=5)
    path = make_run(rows=rows, **EPOCH_RUN)
    from stop_after import stop_after

    with stop_after(2):
        train(load_run_config(path))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "trainer", "train", str(path), "--resume",
                           "--set", "train.placement.nproc_per_node=2", "--set", "seed=5"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "trained with another seed (seed: 0 in the checkpoint, 5 now)" in proc.stderr
    assert "Traceback" not in proc.stderr and "torch.distributed.run" not in proc.stderr
