"""One run on two nodes, as train.yml starts it on two hosts: two launchers (`python -m trainer run`, what
trainer-run@NAME.service runs on each host) with train.placement nnodes=2 and node_rank 0 and 1 meet at
torchrun's rendezvous on loopback and train one gloo job. Each "node" has its own run dir (its own disk);
S3 (moto's server on loopback) carries the shards node 0 uploaded and the checkpoints global rank 0
uploads. Proved here:
- node 1 starts first and waits for node 0's shards, then fetches them byte-identical;
- the job trains the same samples as a 1-node run of the same config with as many ranks: per step the
  same sample count and the same loss;
- global rank 0 is on node 0 (its disk gets the metrics and the checkpoints), as node_rank says;
- killing node 1 mid-run ends the job on node 0 too; a relaunch, node 1 on an empty disk (replaced), resumes
  both nodes from the newest complete S3 checkpoint;
- a node holding other shards than node 0 is refused before the first step.
Real NCCL across hosts is not exercised (no GPU here): gloo over loopback stands in for it."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from dflash_factory import descendants, random_rows

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(s3_server: Any) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def _node_file(base: Path, node: Path, **train: Any) -> Path:
    """The run file as one node holds it: the same run, this node's own run dir."""
    data = yaml.safe_load(base.read_text())
    data["run_dir"] = str(node / "run")
    data["train"] = {**data["train"], **train}
    path = node / base.name
    node.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _start(path: Path, rank: int, port: int, s3_server: Any, *extra: str) -> subprocess.Popen[str]:
    sets = ["train.placement.nnodes=2", f"train.placement.node_rank={rank}",
            f"train.placement.rdzv_endpoint=127.0.0.1:{port}", *extra]
    argv = [sys.executable, "-m", "trainer", "run", str(path), *[a for s in sets for a in ("--set", s)]]
    return subprocess.Popen(argv, env=_env(s3_server), text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)


def _lines(run_dir: Path) -> list[dict[str, Any]]:
    f = run_dir / "metrics.jsonl"
    return [json.loads(x) for x in f.read_text().splitlines()] if f.is_file() else []


def _steps(run_dir: Path) -> dict[int, dict[str, Any]]:
    return {r["step"]: r for r in _lines(run_dir) if "loss" in r}


def _s3_complete(client: Any, bucket: str, key: str) -> bool:
    try:
        client.head_object(Bucket=bucket, Key=key)
        return True
    except Exception:
        return False


@pytest.fixture()
def two_nodes(make_run, s3_server: Any, tmp_path: Path) -> dict[str, Any]:
    """The run file, node 0 with prepared shards uploaded as prepare uploads them, node 1 with nothing."""
    from trainer.config import S3Config, load_run_config
    from trainer.data.stage import upload_manifest_last
    from trainer.layout import RunLayout
    from trainer.s3 import make_client

    bucket = f"two-nodes-{os.getpid()}-{time.monotonic_ns() % 10**6}"
    client = make_client(S3Config(endpoint_url=s3_server.endpoint_url))
    client.create_bucket(Bucket=bucket)
    base = make_run(rows=random_rows(16, 40, seed=21), drafter={"max_anchors": 4, "block_size": 4},
                    data={"upload_shards": True},
                    train={"batch_size": 4, "log_every": 1, "save_every": 4, "keep_last": 2, "lr": 1e-3,
                           "max_steps": 400, "upload_checkpoints": True,
                           "placement": {"nproc_per_node": 1, "strategy": "ddp"}},
                    s3={"bucket": bucket, "prefix": "runs/two", "endpoint_url": s3_server.endpoint_url})
    made = tmp_path / "run" / "shards"  # make_run wrote the shards there
    node0, node1 = tmp_path / "node0", tmp_path / "node1"
    f0, f1 = _node_file(base, node0), _node_file(base, node1)
    shutil.copytree(made, node0 / "run" / "shards")
    return {"base": base, "node0": node0, "node1": node1, "f0": f0, "f1": f1, "client": client,
            "bucket": bucket, "upload": lambda: upload_manifest_last(
                S3Config(bucket=bucket, endpoint_url=s3_server.endpoint_url), node0 / "run" / "shards",
                f"s3://{bucket}/runs/two/shards"),
            "layout": RunLayout.of(load_run_config(f0))}


def test_two_nodes_train_one_job_then_survive_losing_node_1(two_nodes: dict[str, Any], s3_server: Any,
                                                             tmp_path: Path) -> None:
    t = two_nodes
    port = _free_port()
    # node 1's unit starts first: its launcher waits for node 0's shards on S3 before torchrun
    n1 = _start(t["f1"], 1, port, s3_server, "train.max_steps=6")
    time.sleep(3)
    assert n1.poll() is None, n1.communicate()[0][-3000:]
    t["upload"]()  # node 0's prepare uploads its shards, manifest last
    n0 = _start(t["f0"], 0, port, s3_server, "train.max_steps=6")
    out0, out1 = (p.communicate(timeout=300)[0] for p in (n0, n1))
    assert n0.returncode == 0, out0[-3000:]
    assert n1.returncode == 0, out1[-3000:]
    assert "waits for node 0's shards" in out1 or "fetched" in out1, out1[-3000:]
    assert "shards: fetched" in out1
    for name in sorted(p.name for p in (t["node0"] / "run" / "shards").iterdir()):
        assert (t["node1"] / "run" / "shards" / name).read_bytes() == (
            t["node0"] / "run" / "shards" / name).read_bytes()
    assert "rank 0/2: drafter on cpu" in out0 and "rank 1/2: drafter on cpu" in out1  # ranks follow node_rank
    two = _steps(t["node0"] / "run")
    assert sorted(two) == [1, 2, 3, 4, 5, 6]
    assert not (t["node1"] / "run" / "metrics.jsonl").exists()  # global rank 0 alone writes them, on node 0
    assert [p.name for p in (t["node0"] / "run" / "checkpoints").iterdir() if p.name.startswith("step-")]

    # the same config on one node with two ranks: the same samples, step by step
    ref = _node_file(t["base"], tmp_path / "ref", max_steps=6, upload_checkpoints=False,
                     placement={"nproc_per_node": 2, "strategy": "ddp"})
    shutil.copytree(t["node0"] / "run" / "shards", tmp_path / "ref" / "run" / "shards")
    one = subprocess.run([sys.executable, "-m", "trainer", "run", str(ref), "--set",
                          "data.upload_shards=false"], env=_env(s3_server), text=True, capture_output=True,
                         timeout=300)
    assert one.returncode == 0, (one.stdout + one.stderr)[-3000:]
    single = _steps(tmp_path / "ref" / "run")
    assert [single[s]["samples"] for s in sorted(single)] == [two[s]["samples"] for s in sorted(two)]
    for s in sorted(two):
        assert two[s]["loss"] == pytest.approx(single[s]["loss"], rel=1e-5, abs=1e-6), (s, two[s], single[s])

    # a longer run: kill node 1 once a checkpoint is complete on S3; node 0's job ends with it
    port = _free_port()
    n0 = _start(t["f0"], 0, port, s3_server, "train.max_steps=400")
    n1 = _start(t["f1"], 1, port, s3_server, "train.max_steps=400")
    key = "runs/two/checkpoints/step-0000012/files.json"  # the first save after step 6's resume (every 4)
    deadline = time.monotonic() + 240
    while not _s3_complete(t["client"], t["bucket"], key):
        assert time.monotonic() < deadline and n0.poll() is None and n1.poll() is None, (
            n0.poll(), n1.poll())
        time.sleep(0.05)
    for pid in [n1.pid, *descendants(n1.pid)]:  # the host is gone: its launcher, torchrun and its rank
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    out1 = n1.communicate(timeout=60)[0]
    out0 = n0.communicate(timeout=300)[0]
    assert n0.returncode not in (0, 130), out0[-3000:]  # the job failed on node 0 too
    assert "resumed from" in out0 and "at step 6 " in out0  # the earlier job's end, fetched or local
    # node 1 is replaced: a new disk; the relaunch resumes both nodes from the newest complete S3 checkpoint
    shutil.rmtree(t["node1"] / "run")
    port = _free_port()
    done_at = 14
    n1 = _start(t["f1"], 1, port, s3_server, f"train.max_steps={done_at}")
    n0 = _start(t["f0"], 0, port, s3_server, f"train.max_steps={done_at}")
    out0, out1 = (p.communicate(timeout=300)[0] for p in (n0, n1))
    assert n0.returncode == 0 and n1.returncode == 0, (out0[-2000:], out1[-2000:])
    assert "resume: fetched step-0000012" in out1, out1[-3000:]
    at = [line for line in out0.splitlines() if "resumed from" in line][-1]
    assert "at step 12 " in at, at
    assert "at step 12 " in [line for line in out1.splitlines() if "resumed from" in line][-1]
    assert max(_steps(t["node0"] / "run")) == done_at


def test_a_node_with_other_shards_is_refused_before_the_first_step(two_nodes: dict[str, Any],
                                                                   s3_server: Any) -> None:
    """Node 1 keeps a copy that differs from node 0's (no S3 copy to compare with: upload_shards off): the
    ranks compare what their manifests say and the job stops, naming the reason, before training."""
    t = two_nodes
    from dflash_factory import write_shards

    write_shards(t["node1"] / "run" / "shards", random_rows(16, 40, seed=99))
    port = _free_port()
    procs = [_start(t[f"f{r}"], r, port, s3_server, "train.max_steps=3", "data.upload_shards=false",
                    "train.upload_checkpoints=false") for r in (0, 1)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode not in (0, None) for p in procs), [o[-1500:] for o in outs]
    assert any("the ranks' shards differ" in o for o in outs), [o[-1500:] for o in outs]
    assert not _steps(t["node0"] / "run")  # no step was trained
