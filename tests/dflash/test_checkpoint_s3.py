"""train.upload_checkpoints: each checkpoint is copied to s3://<bucket>/<prefix>/checkpoints/step-N/ (a real
S3 HTTP endpoint: moto's server on loopback); the loader refuses the setting without s3.bucket."""
from __future__ import annotations

from typing import Any

import pytest
from dflash_factory import random_rows

from trainer.config import ConfigError, load_run_config
from trainer.dflash.loop import train


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
