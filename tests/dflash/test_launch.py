"""The train stage starts torchrun itself: `python -m trainer run RUN.yml` (what trainer-run@NAME.service
executes) with train.placement.nproc_per_node: 2 on CPU runs 2 gloo ranks; SIGINT makes every rank
checkpoint and a relaunch resumes; a killed rank stops the run with a message naming it."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from dflash_factory import descendants, random_rows

from trainer.config import load_run_config
from trainer.dflash import checkpoint as ckpt
from trainer.layout import RunLayout

REPO = Path(__file__).resolve().parents[2]
RUN = {"drafter": {"max_anchors": 4, "block_size": 4},
       "train": {"batch_size": 1, "log_every": 1, "save_every": 0, "lr": 1e-3,
                 "placement": {"nproc_per_node": 2, "strategy": "ddp"}}}


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def _start(path: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "trainer", "run", str(path)], env=_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _steps(run_dir: Path) -> list[int]:
    f = run_dir / "metrics.jsonl"
    return [json.loads(x)["step"] for x in f.read_text().splitlines()] if f.is_file() else []


def _wait_for_step(proc: subprocess.Popen[str], run_dir: Path, step: int, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if _steps(run_dir) and _steps(run_dir)[-1] >= step:
            return
        time.sleep(0.1)
    raise AssertionError(f"step {step} not reached (rc {proc.poll()}): {proc.communicate()[0][-3000:]}")


def test_run_trains_two_gloo_ranks_under_torchrun(make_run) -> None:
    path = make_run(rows=random_rows(8, 32, seed=3), train={**RUN["train"], "max_steps": 3},
                    drafter=RUN["drafter"])
    cfg = load_run_config(path)
    out = subprocess.run([sys.executable, "-m", "trainer", "run", str(path)], env=_env(), text=True,
                         capture_output=True, timeout=300)
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-3000:]
    assert "torch.distributed.run --nnodes=1 --nproc-per-node=2" in log
    assert "rank 0/2: drafter on cpu" in log and "rank 1/2: drafter on cpu" in log  # both ranks trained
    kept = ckpt.list_checkpoints(RunLayout.of(cfg).root / "checkpoints")
    assert [p.name for p in kept] == ["step-0000003"]
    assert json.loads((kept[0] / "meta.json").read_text())["world_size"] == 2
    assert _steps(RunLayout.of(cfg).root) == [1, 2, 3]  # rank 0 alone writes the metrics
    assert (RunLayout.of(cfg).root / "launch" / "config.yml").is_file()


def test_sigint_checkpoints_every_rank_and_relaunch_resumes(make_run) -> None:
    path = make_run(rows=random_rows(8, 32, seed=4), train={**RUN["train"], "max_steps": 400},
                    drafter=RUN["drafter"])
    cfg = load_run_config(path)
    proc = _start(path)
    _wait_for_step(proc, RunLayout.of(cfg).root, 2)
    proc.send_signal(signal.SIGINT)
    log = proc.communicate(timeout=120)[0]
    assert proc.returncode == 130, log[-3000:]
    assert "rank 0: SIGINT received" in log and "rank 1: SIGINT received" in log
    stopped = ckpt.latest_checkpoint(RunLayout.of(cfg).root / "checkpoints")
    assert stopped is not None, log[-3000:]
    at = int(stopped.name.split("-")[1])
    assert 2 <= at < 400
    assert json.loads((stopped / "meta.json").read_text())["world_size"] == 2
    assert not (RunLayout.of(cfg).root / "export").exists()  # stopped: no export, no later stage
    # relaunch (the unit started again) resumes from that checkpoint; fewer steps to keep the test short
    again = subprocess.run([sys.executable, "-m", "trainer", "run", str(path),
                            "--set", f"train.max_steps={at + 2}"], env=_env(), text=True, capture_output=True,
                           timeout=300)
    log2 = again.stdout + again.stderr
    assert again.returncode == 0, log2[-3000:]
    assert f"at step {at} " in log2  # "resumed from .../step-N at step N (epoch E)"
    assert _steps(RunLayout.of(cfg).root)[-2:] == [at + 1, at + 2]


def test_sigint_to_every_process_as_systemd_sends_it(make_run) -> None:
    """trainer-run@.service stops with KillSignal=SIGINT to the whole cgroup (KillMode=control-group): the
    launcher, torchrun's agent and every rank get SIGINT at once; still one checkpoint, exit 130."""
    path = make_run(rows=random_rows(8, 32, seed=6), train={**RUN["train"], "max_steps": 400},
                    drafter=RUN["drafter"])
    cfg = load_run_config(path)
    proc = _start(path)
    _wait_for_step(proc, RunLayout.of(cfg).root, 2)
    tree = [proc.pid, *descendants(proc.pid)]
    assert len(tree) >= 4  # launcher, torchrun, 2 ranks
    for pid in tree:
        os.kill(pid, signal.SIGINT)
    log = proc.communicate(timeout=120)[0]
    assert proc.returncode == 130, log[-3000:]
    stopped = ckpt.latest_checkpoint(RunLayout.of(cfg).root / "checkpoints")
    assert stopped is not None and int(stopped.name.split("-")[1]) >= 2, log[-3000:]
    time.sleep(1)
    assert [p for p in tree if Path(f"/proc/{p}").exists()] == []


def _rank_pids(launch_cfg: Path) -> dict[int, int]:
    """local rank -> pid of the rank processes running `trainer train <launch config>`."""
    found = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
            env = dict(x.split(b"=", 1) for x in (d / "environ").read_bytes().split(b"\0") if b"=" in x)
        except OSError:
            continue
        if str(launch_cfg).encode() in cmd and b"LOCAL_RANK" in env and b"torch.distributed.run" not in cmd:
            found[int(env[b"LOCAL_RANK"])] = int(d.name)
    return found


def test_a_killed_rank_stops_the_run_naming_it(make_run) -> None:
    path = make_run(rows=random_rows(8, 32, seed=5), train={**RUN["train"], "max_steps": 400},
                    drafter=RUN["drafter"])
    cfg = load_run_config(path)
    proc = _start(path)
    _wait_for_step(proc, RunLayout.of(cfg).root, 1)
    pids = _rank_pids((RunLayout.of(cfg).root / "launch" / "config.yml").resolve())
    assert sorted(pids) == [0, 1], pids
    os.kill(pids[1], signal.SIGKILL)
    log = proc.communicate(timeout=180)[0]
    assert proc.returncode == 1, log[-3000:]
    assert "rank 1 (local rank 1 on node 0) killed by SIGKILL with exit code -9" in log, log[-3000:]
    assert all(not Path(f"/proc/{p}").exists() for p in pids.values())
