"""Shards on every node of a multi-node run: `prepare` on node 0 uploads them with manifest.json last, and
each node's train launcher fetches the S3 copy when its own differs, checks every file against the
manifest (size, sha256) and swaps it in whole; a matching copy is left alone, a stale one kept aside, and
an S3 copy without its manifest (an upload cut short) refused. S3 is moto's server on loopback."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from data_factory import healthy, write_jsonl

from trainer.config import ConfigError, load_run_config
from trainer.data.shard_fetch import ShardFetchError, ensure_shards
from trainer.data.shards import MANIFEST, ShardDataset, check_doctor


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def _config(tmp: Path, tok_dir: Path, node: str, bucket: str, endpoint: str) -> Any:
    raw = {"name": "t", "run_dir": str(tmp / node), "target": {"path": str(tok_dir)},
           "data": {"num_workers": 1, "max_length": 1024, "heldout_share": 0.2, "upload_shards": True},
           "s3": {"bucket": bucket, "prefix": "t", "endpoint_url": endpoint}}
    path = tmp / f"{node}-config" / "t.yml"  # a run is named after its file
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump(raw))
    return load_run_config(path)


@pytest.fixture()
def prepared(s3_server: Any, tmp_path: Path, tiny_tok_dir: Path, request: pytest.FixtureRequest) -> Any:
    """Node 0 prepared and uploaded the shards (and held-out ones); -> (client, bucket, node-config maker)."""
    from trainer.config import S3Config
    from trainer.data.stage import stage
    from trainer.s3 import make_client

    bucket = request.node.name.replace("_", "-")[:40].strip("-").lower()
    client = make_client(S3Config(endpoint_url=s3_server.endpoint_url))
    client.create_bucket(Bucket=bucket)
    write_jsonl(tmp_path / "node0" / "generated" / "part-00000-ab12.jsonl", [healthy(i) for i in range(40)])

    def node(name: str) -> Any:
        return _config(tmp_path, tiny_tok_dir, name, bucket, s3_server.endpoint_url)

    assert stage(node("node0")) == 0
    return client, bucket, node


def test_the_upload_puts_the_manifest_last(s3_server: Any, tmp_path: Path, tiny_tok_dir: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import trainer.s3
    from trainer.config import S3Config
    from trainer.data.stage import stage

    client = trainer.s3.make_client(S3Config(endpoint_url=s3_server.endpoint_url))
    client.create_bucket(Bucket="order")
    sent: list[str] = []
    real_upload = client.upload_file

    def recording(src: str, bucket: str, key: str, **kw: Any) -> Any:
        sent.append(key)
        return real_upload(src, bucket, key, **kw)

    client.upload_file = recording
    monkeypatch.setattr(trainer.s3, "make_client", lambda *a, **k: client)
    write_jsonl(tmp_path / "node0" / "generated" / "part-00000-ab12.jsonl", [healthy(i) for i in range(40)])
    assert stage(_config(tmp_path, tiny_tok_dir, "node0", "order", s3_server.endpoint_url)) == 0
    for d in ("t/shards/", "t/shards-heldout/"):
        mine = [k for k in sent if k.startswith(d)]
        assert mine[-1] == d + MANIFEST and len(mine) >= 3, sent


def test_a_node_without_shards_fetches_them_byte_identical(prepared: Any, tmp_path: Path) -> None:
    _, _, node = prepared
    got = ensure_shards(node("node1"))
    for name in ("shards", "shards-heldout"):
        assert got[tmp_path / "node1" / name] == "fetched"
        assert _files(tmp_path / "node1" / name) == _files(tmp_path / "node0" / name)
    assert len(ShardDataset.open(tmp_path / "node1" / "shards", verify=True)) > 0
    check_doctor(tmp_path / "node1" / "shards")
    assert sorted(p.name for p in (tmp_path / "node1").iterdir()) == ["shards", "shards-heldout"]


def test_a_matching_copy_is_left_alone(prepared: Any, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    client, _, node = prepared
    ensure_shards(node("node1"), client)

    def no_download(*a: Any, **k: Any) -> None:
        raise AssertionError("a matching copy was downloaded again")

    monkeypatch.setattr(client, "download_file", no_download)
    for name in ("node0", "node1"):  # node 0 made them, node 1 fetched them: both match
        got = ensure_shards(node(name), client)
        assert set(got.values()) == {"kept"}, got
    # the same data prepared on node 1 itself: its manifest says when and from where, not what else
    path = tmp_path / "node1" / "shards" / MANIFEST
    path.write_text(json.dumps({**json.loads(path.read_text()), "seconds": 99.0}))
    assert ensure_shards(node("node1"), client)[path.parent] == "kept"


def test_a_stale_copy_is_replaced_and_kept_aside(prepared: Any, tmp_path: Path) -> None:
    _, _, node = prepared
    old = tmp_path / "node1" / "shards"
    old.mkdir(parents=True)
    (old / "shard-00000.arrow").write_bytes(b"an earlier prepare")
    (old / MANIFEST).write_text(json.dumps({"format": 1, "shards": [
        {"name": "shard-00000.arrow", "rows": 1, "bytes": 18, "sha256": "0" * 64}]}))
    before = _files(old)
    assert ensure_shards(node("node1"))[old] == "fetched"
    assert _files(old) == _files(tmp_path / "node0" / "shards")
    aside = list((tmp_path / "node1").glob(".shards.stale-*"))
    assert len(aside) == 1 and _files(aside[0]) == before


def test_an_s3_copy_without_its_manifest_is_refused(prepared: Any, tmp_path: Path) -> None:
    from trainer.dflash.stage import fetch_inputs

    client, bucket, node = prepared
    ensure_shards(node("node1"), client)
    kept = _files(tmp_path / "node1" / "shards")
    client.delete_object(Bucket=bucket, Key="t/shards/manifest.json")  # an upload cut short
    with pytest.raises(ConfigError) as e:
        fetch_inputs(node("node1"), resume=False)
    assert f"s3://{bucket}/t/shards/manifest.json does not exist" in str(e.value)
    assert "\n" not in str(e.value)
    assert _files(tmp_path / "node1" / "shards") == kept  # nothing changed on the node
    with pytest.raises(ShardFetchError, match="incomplete"):
        ensure_shards(node("node2"), client)
    assert not (tmp_path / "node2" / "shards").exists()


def _on_node(cfg: Any, **placement: Any) -> Any:
    import dataclasses

    p = dataclasses.replace(cfg.train.placement, **placement)
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, placement=p))


def test_another_node_waits_for_node_0s_upload_and_gives_up_naming_it(
        prepared: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: Any) -> None:
    """Node 1 of a multi-node run starts while node 0 still prepares: it waits for the manifest (saying
    so), fetches once it is there, and after train.placement.timeout_min gives up naming the URL."""
    import logging
    import threading

    import trainer.data.shard_fetch as sf

    client, bucket, node = prepared
    body = client.get_object(Bucket=bucket, Key="t/shards/manifest.json")["Body"].read()
    client.delete_object(Bucket=bucket, Key="t/shards/manifest.json")  # node 0's upload still under way
    monkeypatch.setattr(sf, "WAIT_POLL_S", 0.05)
    other = _on_node(node("node1"), nnodes=2, node_rank=1)
    key = "t/shards/manifest.json"
    put = threading.Timer(0.5, lambda: client.put_object(Bucket=bucket, Key=key, Body=body))
    put.start()
    with caplog.at_level(logging.INFO, logger="trainer.data.shard_fetch"):
        assert ensure_shards(other, client)[tmp_path / "node1" / "shards"] == "fetched"
    put.join()
    assert "node 1 of 2 waits for node 0's shards" in caplog.text
    client.delete_object(Bucket=bucket, Key="t/shards/manifest.json")
    late = _on_node(node("node2"), nnodes=2, node_rank=1, timeout_min=0.005)
    with pytest.raises(ShardFetchError, match=r"does not exist.*waited 0.005 min"):
        ensure_shards(late, client)
    node0 = _on_node(node("node3"), nnodes=2, node_rank=0)  # node 0 does not wait: its prepare uploads
    with pytest.raises(ShardFetchError, match="incomplete"):
        ensure_shards(node0, client)


def test_a_shard_that_changed_on_s3_is_refused_and_nothing_swapped_in(prepared: Any, tmp_path: Path) -> None:
    client, bucket, node = prepared
    key = "t/shards/shard-00000.arrow"
    size = client.head_object(Bucket=bucket, Key=key)["ContentLength"]
    client.put_object(Bucket=bucket, Key=key, Body=b"x" * size)  # same size, other bytes, no sha256 metadata
    with pytest.raises(ShardFetchError, match=rf"s3://{bucket}/{key}: does not match .*manifest.json"):
        ensure_shards(node("node1"), client)
    assert not (tmp_path / "node1" / "shards").exists()


def test_a_new_upload_deletes_an_s3_manifest_of_other_files_first(prepared: Any, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Other data: the old manifest goes before any new file, so it never describes a mix. The same data
    prepared again (another time, another node): the manifest is replaced in one PUT, never missing."""
    import trainer.s3
    from trainer.data.shards import sha256_file
    from trainer.data.stage import upload_manifest_last

    client, bucket, node = prepared
    ops: list[str] = []
    real_upload, real_delete = client.upload_file, client.delete_object
    monkeypatch.setattr(client, "upload_file", lambda src, b, key, **kw: (ops.append(f"put {key}"),
                                                                         real_upload(src, b, key, **kw))[1])
    monkeypatch.setattr(client, "delete_object", lambda **kw: (ops.append(f"delete {kw['Key']}"),
                                                               real_delete(**kw))[1])
    monkeypatch.setattr(trainer.s3, "make_client", lambda *a, **k: client)
    s3, local = node("node0").s3, tmp_path / "node0" / "shards"
    manifest = json.loads((local / MANIFEST).read_text())
    (local / MANIFEST).write_text(json.dumps({**manifest, "seconds": 99.0}))
    upload_manifest_last(s3, local, f"s3://{bucket}/t/shards")
    assert ops == [f"put t/shards/{MANIFEST}"]
    body = client.get_object(Bucket=bucket, Key=f"t/shards/{MANIFEST}")["Body"].read()
    assert json.loads(body)["seconds"] == 99.0
    ops.clear()
    (local / "samples.arrow").write_bytes(b"other data")
    manifest["samples"] = {**manifest["samples"], "bytes": 10, "sha256": sha256_file(local / "samples.arrow")}
    (local / MANIFEST).write_text(json.dumps(manifest))
    upload_manifest_last(s3, local, f"s3://{bucket}/t/shards")
    assert ops == [f"delete t/shards/{MANIFEST}", "put t/shards/samples.arrow", f"put t/shards/{MANIFEST}"]
