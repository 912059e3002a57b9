"""train.upload_checkpoints: each checkpoint is copied to s3://<bucket>/<prefix>/checkpoints/step-N/ (a real
S3 HTTP endpoint: moto's server on loopback); the loader refuses the setting without s3.bucket. A resume
whose disk lacks the newest checkpoint fetches the newest complete one back, never an upload cut short, in
the train launcher before any rank starts."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from dflash_factory import random_rows

from trainer.config import ConfigError, load_run_config
from trainer.dflash.loop import train
from trainer.dflash.stage import stage
from trainer.layout import latest_checkpoint


def test_checkpoints_are_uploaded(make_run, s3_server: Any) -> None:
    from trainer.config import S3Config
    from trainer.s3 import make_client

    client = make_client(S3Config(endpoint_url=s3_server.endpoint_url))
    client.create_bucket(Bucket="ckpts")
    path = make_run(rows=random_rows(4, 32, seed=7), drafter={"max_anchors": 4, "block_size": 4},
                    train={"max_steps": 2, "save_every": 1, "keep_last": 1, "batch_size": 2},
                    s3={"bucket": "ckpts", "prefix": "runs/x", "endpoint_url": s3_server.endpoint_url})
    cfg = load_run_config(path, ["train.upload_checkpoints=true"])
    assert train(cfg).step == 2
    keys = sorted(o["Key"] for o in client.list_objects_v2(Bucket="ckpts")["Contents"])
    for step in ("step-0000001", "step-0000002"):  # S3 keeps every checkpoint, the disk the last keep_last
        for name in ("config.yml", "drafter.safetensors", "meta.json", "state.pt"):
            assert f"runs/x/checkpoints/{step}/{name}" in keys


def test_upload_needs_a_bucket(make_run) -> None:
    with pytest.raises(ConfigError, match=r"train\.upload_checkpoints is set but s3\.bucket is empty"):
        load_run_config(make_run(), ["train.upload_checkpoints=true"])


def test_a_failed_upload_does_not_stop_training(make_run, s3_server: Any, caplog: Any) -> None:
    path = make_run(rows=random_rows(4, 32, seed=8), drafter={"max_anchors": 4, "block_size": 4},
                    train={"max_steps": 1, "save_every": 1, "batch_size": 2, "upload_checkpoints": True},
                    s3={"bucket": "no-such-bucket", "endpoint_url": s3_server.endpoint_url})
    result = train(load_run_config(path))
    assert result.step == 1 and result.checkpoint is not None and (result.checkpoint / "meta.json").is_file()
    assert "checkpoint upload of" in caplog.text and "failed" in caplog.text


# -- the way back: a resume on a node whose disk lacks the newest checkpoint fetches it from S3 ----------

def _bucket(s3_server: Any, name: str) -> Any:
    from trainer.config import S3Config
    from trainer.s3 import make_client

    client = make_client(S3Config(endpoint_url=s3_server.endpoint_url))
    client.create_bucket(Bucket=name)
    return client


def _uploaded(tmp_path: Path, s3: Any, *steps: int) -> Path:
    """Step dirs saved and uploaded as a run does (save_checkpoint, upload_checkpoint); -> the local root."""
    from trainer.dflash import checkpoint as ckpt

    root = tmp_path / "node0" / "checkpoints"
    for step in steps:
        path = ckpt.save_checkpoint(root, step, weights={"w": torch.full((32,), float(step))},
                                    state={"step": step}, meta={"epoch": 0}, config={"name": "x"},
                                    keep_last=9, optimizer={"state": {}})
        ckpt.upload_checkpoint(path, s3)
    return root


def test_the_upload_puts_the_files_list_last(s3_server: Any, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import trainer.s3
    from trainer.config import S3Config

    client = _bucket(s3_server, "order")
    sent: list[str] = []
    real_upload = client.upload_file

    def recording(src: str, bucket: str, key: str, **kw: Any) -> Any:
        sent.append(key.rsplit("/", 1)[1])
        return real_upload(src, bucket, key, **kw)

    client.upload_file = recording
    monkeypatch.setattr(trainer.s3, "make_client", lambda *a, **k: client)
    _uploaded(tmp_path, S3Config(bucket="order", prefix="r", endpoint_url=s3_server.endpoint_url), 1)
    assert sent[-1] == "files.json" and sorted(sent[:-1]) == [
        "config.yml", "drafter.safetensors", "meta.json", "optimizer.pt", "state.pt"]


def test_an_incomplete_upload_is_never_chosen(s3_server: Any, tmp_path: Path, caplog: Any) -> None:
    from trainer.config import S3Config
    from trainer.dflash.ckpt_sync import fetch_newer, newest_remote

    client = _bucket(s3_server, "partial")
    s3 = S3Config(bucket="partial", prefix="r", endpoint_url=s3_server.endpoint_url)
    _uploaded(tmp_path, s3, 1, 2, 3)
    client.delete_object(Bucket="partial", Key="r/checkpoints/step-0000003/optimizer.pt")  # cut short
    client.delete_object(Bucket="partial", Key="r/checkpoints/step-0000002/files.json")  # under way
    assert newest_remote(client, "partial", "r/checkpoints")[0] == "step-0000001"
    assert "step-0000003 is incomplete (optimizer.pt is missing)" in caplog.text
    assert "step-0000002 has no files.json" in caplog.text
    other = tmp_path / "node1" / "checkpoints"  # another node: nothing local
    got = fetch_newer(other, s3, client)
    assert got == other / "step-0000001" and (other / "latest").read_text() == "step-0000001\n"
    assert sorted(p.name for p in got.iterdir()) == [
        "config.yml", "drafter.safetensors", "files.json", "meta.json", "optimizer.pt", "state.pt"]
    assert not list(other.glob(".fetch-*"))
    # a local checkpoint as new as S3's newest complete one: nothing is fetched
    assert fetch_newer(other, s3, client) is None


def test_a_multi_node_resume_sets_aside_a_local_checkpoint_s3_lacks(s3_server: Any, tmp_path: Path,
                                                                       caplog: Any) -> None:
    """Node 0 saved step 3 but lost the upload with the job (another node died meanwhile): every node resumes
    from S3's newest complete one (step 2), so node 0's step 3 is moved aside, not resumed from, not deleted;
    a one-node resume keeps its newer local checkpoint."""
    from trainer.config import S3Config
    from trainer.dflash.ckpt_sync import fetch_newer

    client = _bucket(s3_server, "multi")
    s3 = S3Config(bucket="multi", prefix="r", endpoint_url=s3_server.endpoint_url)
    root = _uploaded(tmp_path, s3, 1, 2, 3)
    client.delete_object(Bucket="multi", Key="r/checkpoints/step-0000003/files.json")  # the upload cut short
    assert fetch_newer(root, s3, client) is None  # one node: its newer local step 3 stands
    assert latest_checkpoint(root) == root / "step-0000003"
    assert fetch_newer(root, s3, client, only_remote=True) is None  # step 2 is local already
    assert latest_checkpoint(root) == root / "step-0000002"
    aside = list(root.glob(".unsynced-step-0000003-*"))
    assert len(aside) == 1 and (aside[0] / "files.json").is_file()
    assert "step-0000003 is newer than s3://multi/r/checkpoints's newest complete checkpoint" in caplog.text


@pytest.mark.slow
def test_a_resume_on_another_node_continues_from_the_s3_checkpoint(
        make_run, s3_server: Any, tmp_path: Path, caplog: Any) -> None:
    import logging

    from trainer.layout import RunLayout

    _bucket(s3_server, "resume")
    path = make_run(rows=random_rows(4, 32, seed=9), drafter={"max_anchors": 4, "block_size": 4},
                    train={"max_steps": 2, "save_every": 1, "keep_last": 1, "batch_size": 2,
                           "upload_checkpoints": True},
                    s3={"bucket": "resume", "prefix": "runs/y", "endpoint_url": s3_server.endpoint_url})
    assert train(load_run_config(path)).step == 2
    root = RunLayout.of(load_run_config(path)).checkpoints
    shutil.rmtree(root)  # the node that resumes has none of them
    cfg = load_run_config(path, ["train.max_steps=3"])
    with caplog.at_level(logging.INFO):
        assert stage(cfg, resume=True) == 0  # the launcher fetches, then the loop resumes from it
    fetched, resumed = (caplog.text.index(s) for s in (
        "resume: fetched step-0000002", f"resumed from {root / 'step-0000002'} at step 2"))
    assert fetched < resumed
    assert latest_checkpoint(root) == root / "step-0000003"


def test_the_loop_itself_fetches_nothing(make_run, s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside the ranks the process group is up: a download there would hold every other rank in a
    barrier under NCCL's timeout, so only the launcher (stage) fetches."""
    import trainer.dflash.ckpt_sync

    calls: list[Any] = []
    monkeypatch.setattr(trainer.dflash.ckpt_sync, "fetch_newer", lambda *a, **k: calls.append(a))
    _bucket(s3_server, "in-loop")
    path = make_run(rows=random_rows(4, 32, seed=10), drafter={"max_anchors": 4, "block_size": 4},
                    train={"max_steps": 1, "save_every": 1, "batch_size": 2, "upload_checkpoints": True},
                    s3={"bucket": "in-loop", "endpoint_url": s3_server.endpoint_url})
    assert train(load_run_config(path), resume=True).step == 1
    assert calls == []
