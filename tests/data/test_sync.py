"""Parallel S3 sync against a real S3 HTTP server on loopback (moto's server, see tests/conftest.py).

moto stands in for S3 (no AWS here); it speaks the real HTTP API, including multipart and metadata.
"""
from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from trainer.config import S3Config
from trainer.data.sync import S3Sync, SyncError
from trainer.s3 import make_client

N_FILES = 120


def _client(server: Any) -> Any:
    return make_client(S3Config(endpoint_url=server.endpoint_url), max_pool_connections=200)


def _bucket(client: Any) -> str:
    name = f"b-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=name)
    return name


def _tree(root: Path, n: int = N_FILES, size: int = 20_000) -> dict[str, bytes]:
    files = {}
    for i in range(n):
        rel = f"shards/part-{i:04d}.arrow" if i % 2 else f"f-{i:04d}.bin"
        data = os.urandom(size + i)
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        files[rel] = data
    return files


class Counting:
    """Wraps a boto3 client: counts download_file calls per key and the peak number in flight."""

    def __init__(self, client: Any, corrupt_first: set[str] | None = None) -> None:
        self._c, self.calls, self.active, self.peak = client, {}, 0, 0
        self._lock = threading.Lock()
        self.corrupt_first = corrupt_first or set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._c, name)

    def download_file(self, bucket: str, key: str, filename: str, **kw: Any) -> None:
        with self._lock:
            self.calls[key] = self.calls.get(key, 0) + 1
            first = self.calls[key] == 1
            self.active += 1
            self.peak = max(self.peak, self.active)
        try:
            time.sleep(0.01)  # keep transfers overlapping so the concurrency is observable
            self._c.download_file(bucket, key, filename, **kw)
            if first and key in self.corrupt_first:  # a transfer that delivered wrong bytes
                with open(filename, "r+b") as fh:
                    fh.write(b"\xff\xfe")
        finally:
            with self._lock:
                self.active -= 1


def test_upload_download_many_objects_with_concurrency_20(s3_server: Any, tmp_path: Path) -> None:
    client = _client(s3_server)
    bucket = _bucket(client)
    files = _tree(tmp_path / "src")
    up = S3Sync(client, bucket, "run/x", concurrency=20, show_progress=False).upload(tmp_path / "src")
    assert (up.files, up.transferred) == (N_FILES, N_FILES)
    head = client.head_object(Bucket=bucket, Key="run/x/shards/part-0001.arrow")
    assert head["Metadata"]["sha256"] == hashlib.sha256(files["shards/part-0001.arrow"]).hexdigest()
    again = S3Sync(client, bucket, "run/x", concurrency=20, show_progress=False).upload(tmp_path / "src")
    assert (again.transferred, again.skipped) == (0, N_FILES)  # resume of an upload: nothing re-sent

    counting = Counting(client)
    down = S3Sync(counting, bucket, "run/x", concurrency=20, show_progress=False).download(tmp_path / "dst")
    assert (down.files, down.transferred, down.unverified) == (N_FILES, N_FILES, 0)
    assert 2 <= counting.peak <= 20
    for rel, data in files.items():
        assert (tmp_path / "dst" / rel).read_bytes() == data
    assert not list((tmp_path / "dst").rglob("*.part"))


def test_corrupted_objects_are_detected_and_refetched(s3_server: Any, tmp_path: Path) -> None:
    client = _client(s3_server)
    bucket = _bucket(client)
    files = _tree(tmp_path / "src", n=30)
    S3Sync(client, bucket, "p", show_progress=False).upload(tmp_path / "src")
    # a transfer that delivers wrong bytes is caught by the checksum and retried
    bad_key = "p/f-0004.bin"
    counting = Counting(client, corrupt_first={bad_key})
    stats = S3Sync(counting, bucket, "p", show_progress=False, backoff_s=0.01).download(tmp_path / "dst")
    assert counting.calls[bad_key] == 2 and stats.retries == 1
    assert (tmp_path / "dst" / "f-0004.bin").read_bytes() == files["f-0004.bin"]
    # a local copy corrupted later (same size) is detected on the next sync and only it is fetched again
    target = tmp_path / "dst" / "shards" / "part-0003.arrow"
    with open(target, "r+b") as fh:
        fh.seek(100)
        fh.write(b"BITROT")
    counting = Counting(client)
    stats = S3Sync(counting, bucket, "p", show_progress=False).download(tmp_path / "dst")
    assert counting.calls == {"p/shards/part-0003.arrow": 1}
    assert (stats.transferred, stats.skipped) == (1, 29)
    assert target.read_bytes() == files["shards/part-0003.arrow"]


def test_object_that_never_verifies_fails_naming_file_and_endpoint(s3_server: Any, tmp_path: Path) -> None:
    client = _client(s3_server)
    bucket = _bucket(client)
    client.put_object(Bucket=bucket, Key="q/bad.bin", Body=b"payload", Metadata={"sha256": "0" * 64})
    client.put_object(Bucket=bucket, Key="q/good.bin", Body=b"fine")
    with pytest.raises(SyncError, match=r"bad\.bin: ChecksumMismatch") as exc:
        S3Sync(client, bucket, "q", attempts=2, backoff_s=0.01, show_progress=False).download(tmp_path / "d")
    assert s3_server.endpoint_url in str(exc.value)
    assert (tmp_path / "d" / "good.bin").read_bytes() == b"fine"
    assert not (tmp_path / "d" / "bad.bin").exists() and not (tmp_path / "d" / "bad.bin.part").exists()


@pytest.mark.parametrize("hostile", ["//{abs}", "/../../sentinel", "/a/../../../sentinel"])
def test_keys_that_would_leave_the_directory_are_refused_before_any_download(
        s3_server: Any, tmp_path: Path, hostile: str) -> None:
    """S3 stores `q//abs/path` and `q/../../x` like any key; joined as they are, they would write outside
    the target (pathlib drops it before an absolute part, `..` climbs out)."""
    client = _client(s3_server)
    bucket = _bucket(client)
    sentinel = tmp_path / "sentinel"
    key = "q" + hostile.format(abs=sentinel)
    client.put_object(Bucket=bucket, Key="q/good.bin", Body=b"fine")
    client.put_object(Bucket=bucket, Key=key, Body=b"evil")
    listed = [o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]]
    assert listed == sorted([key, "q/good.bin"]), "S3 keeps such keys as they are"
    dest = tmp_path / "a" / "d"
    with pytest.raises(SyncError, match="refusing unsafe object key") as exc:
        S3Sync(client, bucket, "q", show_progress=False).download(dest)
    assert repr(key) in str(exc.value) and s3_server.endpoint_url in str(exc.value)
    assert not sentinel.exists() and not list(dest.rglob("*")), "nothing may be written"


def test_a_symlink_in_the_target_that_points_out_is_not_followed(s3_server: Any, tmp_path: Path) -> None:
    client = _client(s3_server)
    bucket = _bucket(client)
    client.put_object(Bucket=bucket, Key="q/good.bin", Body=b"fine")
    client.put_object(Bucket=bucket, Key="q/sub/x.bin", Body=b"evil")
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "d"
    dest.mkdir()
    (dest / "sub").symlink_to(outside)
    with pytest.raises(SyncError, match=r"refusing object key 'q/sub/x\.bin'.*outside") as exc:
        S3Sync(client, bucket, "q", show_progress=False).download(dest)
    assert str(outside) in str(exc.value)
    assert not list(outside.iterdir()) and not (dest / "good.bin").exists()


def test_multipart_objects_are_verified(s3_server: Any, tmp_path: Path) -> None:
    client = _client(s3_server)
    bucket = _bucket(client)
    big = os.urandom(12 * 1024 * 1024 + 17)
    from boto3.s3.transfer import TransferConfig

    # a plain boto3 multipart upload, no sha256 metadata: the multipart ETag is what verifies it

    src = tmp_path / "big.bin"
    src.write_bytes(big)
    client.upload_file(str(src), bucket, "m/big.bin",
                       Config=TransferConfig(multipart_threshold=5 * 2**20, multipart_chunksize=5 * 2**20))
    assert "-" in client.head_object(Bucket=bucket, Key="m/big.bin")["ETag"]
    stats = S3Sync(client, bucket, "m", chunk_mb=8, show_progress=False).download(tmp_path / "d")
    assert stats.unverified == 0 and (tmp_path / "d" / "big.bin").read_bytes() == big


def test_interrupted_sync_resumes_without_refetching_completed_files(s3_server: Any, tmp_path: Path) -> None:
    client = _client(s3_server)
    bucket = _bucket(client)
    _tree(tmp_path / "src", n=N_FILES, size=64_000)
    S3Sync(client, bucket, "r", show_progress=False).upload(tmp_path / "src")
    dst = tmp_path / "dst"
    env = dict(os.environ, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer", "sync", "down", str(dst), f"s3://{bucket}/r",
         "--endpoint-url", s3_server.endpoint_url, "--concurrency", "2"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    # Only finished files count: in flight there are our NAME.part and boto3's own NAME.part.XXXXXXXX.
    def finished() -> list[Path]:
        return [p for p in dst.rglob("*") if p.is_file() and ".part" not in p.name]

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(finished()) < 10:
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)  # the hard way: no cleanup, maybe partial files left behind
    proc.wait()
    complete = {p: p.stat().st_mtime_ns for p in finished()}
    assert 10 <= len(complete) < N_FILES, "the sync was not interrupted mid-way"
    counting = Counting(client)
    stats = S3Sync(counting, bucket, "r", show_progress=False).download(dst)
    assert stats.skipped == len(complete) and stats.transferred == N_FILES - len(complete)
    fetched = {k.removeprefix("r/") for k in counting.calls}
    assert not fetched & {str(p.relative_to(dst)) for p in complete}
    assert all(p.stat().st_mtime_ns == t for p, t in complete.items())
    assert not list(dst.rglob("*.part*")), "an interrupted download's partial file was left behind"
    for p in (tmp_path / "src").rglob("*"):
        if p.is_file():
            assert (dst / p.relative_to(tmp_path / "src")).read_bytes() == p.read_bytes()


def test_leftovers_of_a_killed_download_are_cleared(s3_server: Any, tmp_path: Path) -> None:
    """A SIGKILLed sync leaves our NAME.part and boto3's NAME.part.XXXXXXXX; the next sync removes both,
    whether it re-fetches the file or finds it already complete, and leaves look-alike names alone."""
    client = _client(s3_server)
    bucket = _bucket(client)
    client.put_object(Bucket=bucket, Key="l/a.bin", Body=b"alpha")
    client.put_object(Bucket=bucket, Key="l/sub/b.bin", Body=b"beta")
    dst = tmp_path / "d"
    (dst / "sub").mkdir(parents=True)
    (dst / "a.bin").write_bytes(b"alpha")  # complete: skipped, but its leftovers still go
    leftovers = [dst / "a.bin.part.0fA9c3B1", dst / "sub" / "b.bin.part", dst / "sub" / "b.bin.part.DEADBEEF"]
    for p in leftovers:
        p.write_bytes(b"half")
    keep = [dst / "a.bin.partition", dst / "sub" / "b.bin.part.notours"]
    for p in keep:
        p.write_bytes(b"mine")
    stats = S3Sync(client, bucket, "l", show_progress=False).download(dst)
    assert (stats.skipped, stats.transferred) == (1, 1)
    assert not any(p.exists() for p in leftovers)
    assert all(p.read_bytes() == b"mine" for p in keep)
    assert (dst / "sub" / "b.bin").read_bytes() == b"beta"


def test_outage_fails_with_the_endpoint_then_recovers(s3_server: Any, tmp_path: Path) -> None:
    client = make_client(S3Config(endpoint_url=s3_server.endpoint_url))
    s3_server.stop()
    try:
        with pytest.raises(SyncError, match="cannot list") as exc:
            S3Sync(client, "gone", "x", show_progress=False).download(tmp_path / "d")
        assert s3_server.endpoint_url in str(exc.value)
    finally:
        s3_server.start()
    bucket = _bucket(client)  # moto's state is in memory: a restart starts empty
    client.put_object(Bucket=bucket, Key="x/a.bin", Body=b"back")
    S3Sync(client, bucket, "x", show_progress=False).download(tmp_path / "d")
    assert (tmp_path / "d" / "a.bin").read_bytes() == b"back"


def test_cli_sync_round_trip(s3_server: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from trainer.cli import main

    client = _client(s3_server)
    bucket = _bucket(client)
    _tree(tmp_path / "src", n=5)
    url = f"s3://{bucket}/cli"
    assert main(["sync", "up", str(tmp_path / "src"), url, "--endpoint-url", s3_server.endpoint_url]) == 0
    assert main(["sync", "down", str(tmp_path / "dst"), url, "--endpoint-url", s3_server.endpoint_url]) == 0
    assert "5 files, 5 transferred" in capsys.readouterr().out
    assert main(["sync", "down", str(tmp_path / "x"), f"s3://{bucket}/nothing",
                 "--endpoint-url", s3_server.endpoint_url]) == 2
    assert "no objects under" in capsys.readouterr().err
