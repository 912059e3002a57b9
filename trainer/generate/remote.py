"""The S3 copy of the output: shards, their sidecars (ids + checksum) and manifest.json.

Local spool first, upload after: a shard is uploaded only once sealed locally, then its sidecar (so a
sidecar on S3 means the shard under it is complete), then manifest.json. An S3 outage only delays
uploads: they are retried with backoff while generation goes on. At the end `finish()` reconciles the
bucket with the local manifest (re-uploading anything S3 lost) before the final manifest.json.
A new node resumes from S3: `adopt_remote()` downloads the shards it lacks and marks their ids done.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from trainer.generate.store import ShardInfo, ShardStore, SidecarError, read_records
from trainer.layout import MANIFEST_FILE, REJECTS_FILE, SIDECARS_DIR
from trainer.s3 import join_key
from trainer.safepath import UnsafePathError, inside

log = logging.getLogger("trainer.generate")


class S3Mirror:
    def __init__(self, client: Any, bucket: str, prefix: str, store: ShardStore, *,
                 backoff_initial_s: float = 1.0, backoff_max_s: float = 60.0, concurrency: int = 8) -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = prefix
        self.store = store
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.concurrency = concurrency
        self.pending: asyncio.Queue[ShardInfo] | None = None
        self.busy = False
        self.failures = 0
        self.uploaded = 0

    def key(self, *parts: str) -> str:
        return join_key(self.prefix, *parts)

    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    # ------------------------------------------------------------------- sync helpers (worker threads)
    def remote_sidecars(self) -> dict[str, ShardInfo]:
        """Shard name -> ShardInfo for every sidecar on S3 (SidecarError when one names no plain file)."""
        out: dict[str, ShardInfo] = {}
        paginator = self.client.get_paginator("list_objects_v2")
        pages = paginator.paginate(Bucket=self.bucket, Prefix=self.key(SIDECARS_DIR))
        keys = [o["Key"] for page in pages for o in page.get("Contents", []) if o["Key"].endswith(".json")]
        for key in keys:
            body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
            info = ShardInfo.from_json(json.loads(body), f"s3://{self.bucket}/{key}")
            out[info.name] = info
        return out

    def adopt_remote(self) -> int:
        """Download the shards that S3 has and the local spool lacks; returns how many."""
        remote = self.remote_sidecars()
        missing = [info for name, info in sorted(remote.items()) if name not in self.store.shards]
        paths = {}
        for info in missing:  # every name is checked (by from_json, and here for links) before any fetch
            try:
                paths[info.name] = inside(self.store.out, info.name)
            except UnsafePathError as e:
                raise SidecarError(f"{self.url()}: refusing shard {info.name!r} (named by its sidecar) "
                                   f"for {self.store.out}: {e.reason}") from None

        def fetch(info: ShardInfo) -> ShardInfo:
            path = paths[info.name]
            tmp = path.with_name(path.name + ".tmp")
            self.client.download_file(self.bucket, self.key(info.name), str(tmp))
            ids = tuple(str(r["id"]) for r in read_records(tmp.read_bytes(), info.name))
            if ids != info.ids or tmp.stat().st_size != info.bytes:
                raise RuntimeError(f"s3://{self.bucket}/{self.key(info.name)} does not match its sidecar")
            tmp.replace(path)
            return info

        with ThreadPoolExecutor(max(1, self.concurrency)) as pool:
            for info in pool.map(fetch, missing):
                self.store.adopt(info)
                self.store.mark_uploaded(info.name)
        return len(missing)

    def upload_shard(self, info: ShardInfo) -> None:
        path = self.store.out / info.name
        self.client.upload_file(str(path), self.bucket, self.key(info.name),
                                ExtraArgs={"Metadata": {"sha256": info.sha256}})
        side = self.key(SIDECARS_DIR, info.name.split(".")[0] + ".json")
        self.client.put_object(Bucket=self.bucket, Key=side,
                               Body=json.dumps(info.to_json()).encode(), ContentType="application/json")

    def upload_manifest(self, manifest: dict[str, Any]) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self.key(MANIFEST_FILE),
                               Body=json.dumps(manifest, indent=1).encode(), ContentType="application/json")

    def upload_file(self, path: Path, rel: str) -> None:
        self.client.upload_file(str(path), self.bucket, self.key(rel))

    # ------------------------------------------------------------------- async uploader
    def start(self) -> asyncio.Task:
        self.pending = asyncio.Queue()
        done = self.store.uploaded()
        for name in sorted(self.store.shards):
            if name not in done:
                self.pending.put_nowait(self.store.shards[name])
        return asyncio.create_task(self._run(), name="s3-uploader")

    def enqueue(self, info: ShardInfo) -> None:
        assert self.pending is not None
        self.pending.put_nowait(info)

    async def _retrying(self, what: str, fn: Any, *args: Any) -> Any:
        delay = 0.0
        while True:
            try:
                result = await asyncio.to_thread(fn, *args)
                if delay:
                    log.info("S3 %s: back after the outage", self.url())
                return result
            except Exception as e:  # any S3/network error: keep the spool, retry
                self.failures += 1
                delay = min(self.backoff_max_s, delay * 2 or self.backoff_initial_s)
                log.warning("S3 %s: %s failed (%s: %s); retry in %.0fs, completions stay spooled locally",
                            self.url(), what, type(e).__name__, str(e)[:200], delay)
                await asyncio.sleep(delay)

    async def _run(self) -> None:
        assert self.pending is not None
        while True:
            info = await self.pending.get()
            self.busy = True
            try:
                await self._retrying(f"upload of {info.name}", self.upload_shard, info)
                self.store.mark_uploaded(info.name)
                self.uploaded += 1
                await self._retrying("manifest upload", self.upload_manifest, self.store.manifest())
            finally:
                self.busy = False
                self.pending.task_done()

    async def finish(self, manifest: dict[str, Any], rejects: Path | None, timeout_s: float) -> bool:
        """Drain the uploads, reconcile with S3, upload the final manifest; False on timeout."""
        assert self.pending is not None
        deadline = time.monotonic() + timeout_s
        try:
            await asyncio.wait_for(self.pending.join(), timeout_s)
            while True:
                remote = await asyncio.wait_for(self._retrying("listing", self.remote_sidecars),
                                                max(1.0, deadline - time.monotonic()))
                lost = [i for n, i in sorted(self.store.shards.items()) if remote.get(n) != i]
                if not lost:
                    break
                log.warning("S3 %s lacks %d shards the local manifest has: uploading them again",
                            self.url(), len(lost))
                for info in lost:
                    self.enqueue(info)
                await asyncio.wait_for(self.pending.join(), max(1.0, deadline - time.monotonic()))
            if rejects is not None and rejects.exists():
                await asyncio.wait_for(self._retrying("rejects upload", self.upload_file, rejects,
                                                      REJECTS_FILE),
                                       max(1.0, deadline - time.monotonic()))
            await asyncio.wait_for(self._retrying("manifest upload", self.upload_manifest, manifest),
                                   max(1.0, deadline - time.monotonic()))
            return True
        except TimeoutError:
            return False
