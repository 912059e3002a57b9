"""The local spool: sealing, checksums, and recovery from every point a kill -9 can hit."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from trainer.generate.store import ShardStore, read_records


def rec(i: int) -> dict:
    return {"id": f"r{i}", "messages": [{"role": "user", "content": f"q{i}"},
                                        {"role": "assistant", "content": f"a{i}", "reasoning_content": ""}],
            "endpoint": "http://e", "finish_reason": "stop", "usage": {"completion_tokens": 1}}


def fill(store: ShardStore, ids: range) -> list[Path]:
    full = []
    for i in ids:
        p = store.write(rec(i))
        if p is not None:
            full.append(p)
    return full


@pytest.mark.parametrize("fmt", ["jsonl", "jsonl.zst"])
def test_seal_writes_shard_sidecar_and_checksum(tmp_path: Path, fmt: str) -> None:
    store = ShardStore(tmp_path, fmt, shard_records=3)
    store.recover()
    full = fill(store, range(7))
    assert len(full) == 2
    for p in full:
        store.register(store.seal(p))
    last = store.rotate()
    store.register(store.seal(last))
    assert sorted(store.shards) == [f"part-0000{i}-{store.session}.{fmt}" for i in range(3)]
    for name, info in store.shards.items():
        data = (tmp_path / name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == info.sha256 and len(data) == info.bytes
        assert [r["id"] for r in read_records(data, name)] == list(info.ids)
        side = json.loads((tmp_path / "_state" / "manifest" / (name.split(".")[0] + ".json")).read_text())
        assert side["ids"] == list(info.ids) and side["sha256"] == info.sha256
    assert not list((tmp_path / "_state" / "open").iterdir())
    m = store.manifest()
    assert m["records"] == 7 and [s["records"] for s in m["shards"]] == [3, 3, 1]


def test_writing_an_id_twice_is_refused(tmp_path: Path) -> None:
    store = ShardStore(tmp_path, "jsonl", 10)
    store.write(rec(1))
    with pytest.raises(RuntimeError, match="written twice"):
        store.write(rec(1))


def test_recover_after_kill_keeps_whole_lines_and_drops_a_torn_one(tmp_path: Path) -> None:
    store = ShardStore(tmp_path, "jsonl.zst", 100)
    fill(store, range(5))
    store._fh.write(b'{"id": "r5", "messages": [')  # the kill hit in the middle of a line
    store._fh.close()
    store.close()
    again = ShardStore(tmp_path, "jsonl.zst", 100)
    notes = again.recover()
    assert again.done == {f"r{i}" for i in range(5)}
    assert any("dropped 1" in n for n in notes)
    (name,) = again.shards
    got = [r["id"] for r in read_records((tmp_path / name).read_bytes(), name)]
    assert got == [f"r{i}" for i in range(5)]
    # the next shard number continues after the recovered one, so names never collide
    again.write(rec(9))
    assert again.rotate().name.startswith("part-00001-")


def test_recover_finishes_a_seal_interrupted_before_the_sidecar(tmp_path: Path) -> None:
    store = ShardStore(tmp_path, "jsonl", 2)
    (p,) = fill(store, range(2))
    info = store.seal(p)
    (tmp_path / "_state" / "manifest" / (info.name.split(".")[0] + ".json")).unlink()
    p.write_text("".join(json.dumps(rec(i)) + "\n" for i in range(2)))  # open file not yet removed either
    store.close()
    again = ShardStore(tmp_path, "jsonl", 2)
    notes = again.recover()
    assert "rebuilt the sidecar" in notes[0]
    assert again.done == {"r0", "r1"} and list(again.shards) == [info.name]
    assert again.shards[info.name].sha256 == info.sha256
    assert not p.exists()


def test_recover_drops_ids_already_in_a_sealed_shard(tmp_path: Path) -> None:
    store = ShardStore(tmp_path, "jsonl", 2)
    (p,) = fill(store, range(2))
    store.register(store.seal(p))
    stray = tmp_path / "_state" / "open" / "part-00007-abcdef.jsonl"
    stray.write_text(json.dumps(rec(1)) + "\n" + json.dumps(rec(3)) + "\n")
    store.close()
    again = ShardStore(tmp_path, "jsonl", 2)
    again.recover()
    ids = [i for info in again.shards.values() for i in info.ids]
    assert sorted(ids) == ["r0", "r1", "r3"]


def test_recover_refuses_a_shard_that_does_not_match_its_sidecar(tmp_path: Path) -> None:
    store = ShardStore(tmp_path, "jsonl", 1)
    (p,) = fill(store, range(1))
    info = store.seal(p)
    (tmp_path / info.name).write_text("truncated")
    store.close()
    with pytest.raises(RuntimeError, match=info.name):
        ShardStore(tmp_path, "jsonl", 1).recover()


def test_recover_refuses_a_sidecar_whose_shard_name_leaves_the_output_dir(tmp_path: Path) -> None:
    from trainer.generate.store import SidecarError

    store = ShardStore(tmp_path / "out", "jsonl", 1)
    (p,) = fill(store, range(1))
    info = store.seal(p)
    store.close()
    side = tmp_path / "out" / "_state" / "manifest" / (info.name.split(".")[0] + ".json")
    side.write_text(json.dumps({**info.to_json(), "shard": "../x"}))
    with pytest.raises(SidecarError, match=rf"{side}: unsafe shard name '\.\./x'"):
        ShardStore(tmp_path / "out", "jsonl", 1).recover()


def test_a_sidecar_on_s3_with_a_hostile_shard_name_is_refused_before_any_fetch(
        tmp_path: Path, s3_server: Any) -> None:
    """A sidecar on S3 names the shard to download and the local file to write: `../x` is refused,
    naming the sidecar, before anything is fetched; the stage stops instead of retrying it as an outage."""
    import uuid

    from trainer.config import S3Config
    from trainer.generate.remote import S3Mirror
    from trainer.generate.stage import adopt_remote
    from trainer.generate.store import SidecarError
    from trainer.s3 import make_client

    client = make_client(S3Config(endpoint_url=s3_server.endpoint_url))
    bucket = f"b-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    elsewhere = ShardStore(tmp_path / "elsewhere", "jsonl", 2)  # a node that uploaded one good shard
    (p,) = fill(elsewhere, range(2))
    good = elsewhere.seal(p)
    elsewhere.register(good)
    S3Mirror(client, bucket, "gen", elsewhere).upload_shard(good)
    elsewhere.close()
    bad = {**good.to_json(), "shard": "../x"}
    bad_key = "gen/_state/manifest/part-00009-ffffff.json"
    client.put_object(Bucket=bucket, Key=bad_key, Body=json.dumps(bad).encode())
    client.put_object(Bucket=bucket, Key="gen/../x", Body=b"evil")

    store = ShardStore(tmp_path / "node" / "out", "jsonl", 2)
    mirror = S3Mirror(client, bucket, "gen", store)
    with pytest.raises(SidecarError, match=rf"s3://{bucket}/{bad_key}: unsafe shard name '\.\./x'"):
        mirror.adopt_remote()
    assert adopt_remote(mirror, timeout_s=60, backoff_s=30, backoff_max_s=30) is None  # at once, no retry
    assert not (tmp_path / "node" / "x").exists()
    assert sorted(p.name for p in (tmp_path / "node" / "out").iterdir()) == ["_state"]
    assert not store.shards and not list((tmp_path / "node" / "out" / "_state" / "manifest").iterdir())
    # a plain name whose file in the output dir is a symlink pointing out is refused as well
    client.delete_object(Bucket=bucket, Key=bad_key)
    (tmp_path / "outside").mkdir()
    (tmp_path / "node" / "out" / good.name).symlink_to(tmp_path / "outside" / good.name)
    with pytest.raises(SidecarError, match=rf"refusing shard '{good.name}' .* outside"):
        mirror.adopt_remote()
    assert not list((tmp_path / "outside").iterdir()) and not store.shards
    store.close()


def test_one_writer_per_output_dir(tmp_path: Path) -> None:
    from trainer.generate.store import StoreLocked

    first = ShardStore(tmp_path, "jsonl", 10)
    with pytest.raises(StoreLocked, match=f"pid {os.getpid()}"):
        ShardStore(tmp_path, "jsonl", 10)
    first.close()
    ShardStore(tmp_path, "jsonl", 10).close()
