"""Parallel S3 sync of many files (shards, completions): bounded concurrency, verified, resumable.

- Up to `concurrency` files in flight (default 20); each goes through boto3's transfer manager
  (`TransferConfig`), which splits large objects into concurrent multipart ranges.
- Every file is verified: the sha256 we store in the object's metadata on upload (`x-amz-meta-sha256`),
  else the MD5 ETag of a single-part object, else a multipart ETag recomputed for the usual part sizes;
  an object none of these can verify is checked by size only and counted as `unverified`.
- Resume: a local file that already matches is skipped (re-hashed, not re-downloaded); downloads land in
  `NAME.part` and are renamed only once verified, so an interrupted sync never leaves a bad file behind.
  The leftovers of a killed sync (`NAME.part`, and boto3's own `NAME.part.XXXXXXXX` temp files) are
  removed when the file is next synced.
- Retries with exponential backoff and jitter per file, on top of botocore's own retries; a failure
  names the file and the endpoint. A progress bar shows bytes/s.
"""
from __future__ import annotations

import dataclasses
import glob
import hashlib
import logging
import os
import random
import string
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from trainer.s3 import join_key
from trainer.safepath import UnsafePathError, check_relative, inside

log = logging.getLogger(__name__)
MB = 1024 * 1024
PART_SUFFIX = ".part"
_NO_RETRY = {"AccessDenied", "NoSuchBucket", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403"}


class SyncError(RuntimeError):
    """A sync that did not complete; the message names the files and the endpoint."""


class ChecksumMismatch(IOError):
    pass


@dataclasses.dataclass(slots=True)
class SyncStats:
    files: int = 0
    transferred: int = 0
    skipped: int = 0
    bytes: int = 0  # bytes transferred (not counting skipped files)
    retries: int = 0
    unverified: int = 0
    seconds: float = 0.0
    failed: list[str] = dataclasses.field(default_factory=list)

    @property
    def mb_per_s(self) -> float:
        return self.bytes / MB / self.seconds if self.seconds else 0.0


def transfer_config(max_concurrency: int = 8, chunk_mb: int = 16) -> Any:
    from boto3.s3.transfer import TransferConfig

    return TransferConfig(multipart_threshold=chunk_mb * MB, multipart_chunksize=chunk_mb * MB,
                          max_concurrency=max_concurrency, use_threads=True)


def _digests(path: Path, want: tuple[str, ...]) -> dict[str, str]:
    hs = {name: hashlib.new(name) for name in want}
    with open(path, "rb") as fh:
        while chunk := fh.read(4 * MB):
            for h in hs.values():
                h.update(chunk)
    return {k: h.hexdigest() for k, h in hs.items()}


def _multipart_etag(path: Path, part_size: int) -> str:
    md5s = []
    with open(path, "rb") as fh:
        while chunk := fh.read(part_size):
            md5s.append(hashlib.md5(chunk).digest())
    return f"{hashlib.md5(b''.join(md5s)).hexdigest()}-{len(md5s)}"


def matches(path: Path, head: dict[str, Any], chunk_bytes: int = 16 * MB) -> bool | None:
    """Does local `path` hold the object described by `head`? None = only the size could be checked."""
    if path.stat().st_size != head["ContentLength"]:
        return False
    meta = {k.lower(): v for k, v in (head.get("Metadata") or {}).items()}
    if "sha256" in meta:
        return _digests(path, ("sha256",))["sha256"] == meta["sha256"]
    etag = str(head.get("ETag", "")).strip('"')
    if etag and "-" not in etag:
        return _digests(path, ("md5",))["md5"] == etag
    if "-" in etag:
        parts = int(etag.rsplit("-", 1)[1])
        size = head["ContentLength"]
        guesses = {chunk_bytes, 8 * MB, 16 * MB, 64 * MB, -(-size // parts // MB) * MB}
        for part in sorted(g for g in guesses if g > 0 and -(-size // g) == parts):
            if _multipart_etag(path, part) == etag:
                return True
        return None
    return None


def _clear_partials(dest: Path) -> None:
    """Remove what a killed download of `dest` left: our `NAME.part` and boto3's `NAME.part.XXXXXXXX`."""
    for p in dest.parent.glob(glob.escape(dest.name + PART_SUFFIX) + "*"):
        rest = p.name[len(dest.name + PART_SUFFIX):]
        if rest == "" or (len(rest) == 9 and rest[0] == "." and all(c in string.hexdigits for c in rest[1:])):
            p.unlink(missing_ok=True)


def _client_error_code(e: BaseException) -> str:
    resp = getattr(e, "response", None) or {}
    return str(resp.get("Error", {}).get("Code", ""))


class _Progress:
    def __init__(self, total: int, desc: str, enabled: bool) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc,
                        disable=not enabled, smoothing=0.05)
        self.lock = threading.Lock()

    def __call__(self, n: int) -> None:
        with self.lock:
            self.bar.update(n)

    def close(self) -> None:
        self.bar.close()


class S3Sync:
    """Sync a local directory with `s3://bucket/prefix/` through `client` (see `trainer.s3.make_client`)."""

    def __init__(self, client: Any, bucket: str, prefix: str = "", *, concurrency: int = 20,
                 attempts: int = 5, backoff_s: float = 0.5, max_backoff_s: float = 20.0,
                 part_concurrency: int = 8, chunk_mb: int = 16, show_progress: bool = True,
                 on_file_done: Callable[[str, str], None] | None = None,
                 include: Callable[[str], bool] | None = None) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.client, self.bucket, self.prefix = client, bucket, prefix.strip("/")
        self.concurrency, self.attempts = concurrency, max(1, attempts)
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        self.chunk_bytes = chunk_mb * MB
        self.tc = transfer_config(part_concurrency, chunk_mb)
        self.show_progress = show_progress
        self.on_file_done = on_file_done
        self.include = include  # relative path -> sync it?; None = everything
        self._lock = threading.Lock()

    @property
    def where(self) -> str:
        return f"s3://{self.bucket}/{self.prefix} at {self.client.meta.endpoint_url}"

    # ------------------------------------------------------------------ listing
    def list_remote(self) -> dict[str, int]:
        """relative path -> size of every object under the prefix."""
        out: dict[str, int] = {}
        base = f"{self.prefix}/" if self.prefix else ""
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=base)
            for page in pages:
                for obj in page.get("Contents", []):
                    rel = obj["Key"][len(base):]
                    if not rel or rel.endswith("/"):
                        continue
                    try:
                        check_relative(rel)
                    except UnsafePathError as e:
                        raise SyncError(f"{self.where}: refusing unsafe object key {obj['Key']!r} "
                                        f"({e.reason})") from None
                    if self.include is None or self.include(rel):
                        out[rel] = int(obj["Size"])
        except SyncError:
            raise
        except Exception as e:
            raise SyncError(f"cannot list {self.where}: {e}") from e
        return out

    # ------------------------------------------------------------------ one file, with retries
    def _retrying(self, rel: str, fn: Callable[[], str], stats: SyncStats) -> str:
        for attempt in range(1, self.attempts + 1):
            try:
                return fn()
            except Exception as e:
                code = _client_error_code(e)
                if code in _NO_RETRY or attempt == self.attempts:
                    raise SyncError(f"{rel}: {type(e).__name__}: {e} ({self.where}, "
                                    f"attempt {attempt})") from e
                with self._lock:
                    stats.retries += 1
                delay = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))
                delay *= random.uniform(0.5, 1.0)
                log.warning("%s: %s (attempt %d/%d), retrying in %.1fs",
                            rel, e, attempt, self.attempts, delay)
                time.sleep(delay)
        raise AssertionError("unreachable")

    def _download_one(self, rel: str, local: Path, progress: _Progress, stats: SyncStats) -> str:
        key = join_key(self.prefix, rel)
        dest = local / rel

        def attempt() -> str:
            head = self.client.head_object(Bucket=self.bucket, Key=key)
            if dest.parent.is_dir():
                _clear_partials(dest)
            if dest.exists() and matches(dest, head, self.chunk_bytes) is not False:
                progress(head["ContentLength"])
                return "skipped"
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(dest.name + PART_SUFFIX)
            self.client.download_file(self.bucket, key, str(tmp), Config=self.tc, Callback=progress)
            ok = matches(tmp, head, self.chunk_bytes)
            if ok is False:
                tmp.unlink(missing_ok=True)
                raise ChecksumMismatch(f"checksum mismatch after download of s3://{self.bucket}/{key}")
            os.replace(tmp, dest)
            with self._lock:
                stats.bytes += head["ContentLength"]
                stats.unverified += ok is None
            return "transferred"

        return self._retrying(rel, attempt, stats)

    def _upload_one(self, rel: str, local: Path, progress: _Progress, stats: SyncStats) -> str:
        key = join_key(self.prefix, rel)
        src = local / rel

        def attempt() -> str:
            size = src.stat().st_size
            sums = _digests(src, ("sha256", "md5"))
            try:
                head = self.client.head_object(Bucket=self.bucket, Key=key)
            except Exception as e:
                if _client_error_code(e) not in ("404", "NoSuchKey", "NotFound"):
                    raise
                head = None
            meta = {k.lower(): v for k, v in ((head or {}).get("Metadata") or {}).items()}
            if head and head["ContentLength"] == size and meta.get("sha256") == sums["sha256"]:
                progress(size)
                return "skipped"
            self.client.upload_file(str(src), self.bucket, key, Config=self.tc, Callback=progress,
                                    ExtraArgs={"Metadata": {"sha256": sums["sha256"]}})
            after = self.client.head_object(Bucket=self.bucket, Key=key)
            etag = str(after.get("ETag", "")).strip('"')
            stored = {k.lower(): v for k, v in (after.get("Metadata") or {}).items()}.get("sha256")
            bad = after["ContentLength"] != size or stored != sums["sha256"]
            if bad or ("-" not in etag and etag and etag != sums["md5"]):
                raise ChecksumMismatch(f"s3://{self.bucket}/{key} does not match {src} after upload")
            with self._lock:
                stats.bytes += size
            return "transferred"

        return self._retrying(rel, attempt, stats)

    # ------------------------------------------------------------------ many files
    def _run(self, items: dict[str, int], one: Callable[..., str], local: Path, desc: str) -> SyncStats:
        stats = SyncStats(files=len(items))
        progress = _Progress(sum(items.values()), desc, self.show_progress)
        t0 = time.perf_counter()
        errors: list[str] = []
        pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="s3sync")
        try:
            futures = {pool.submit(one, rel, local, progress, stats): rel for rel in sorted(items)}
            pending = set(futures)
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    rel = futures[fut]
                    try:
                        outcome = fut.result()
                    except SyncError as e:
                        errors.append(str(e))
                        stats.failed.append(rel)
                        continue
                    if outcome == "skipped":
                        stats.skipped += 1
                    else:
                        stats.transferred += 1
                    if self.on_file_done:
                        self.on_file_done(rel, outcome)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            progress.close()
        stats.seconds = time.perf_counter() - t0
        if errors:
            more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
            raise SyncError(f"{len(errors)} of {len(items)} files failed: " + "; ".join(errors[:3]) + more)
        return stats

    def download(self, local_dir: str | Path) -> SyncStats:
        """Fetch every object under the prefix into `local_dir` (skipping files that already match)."""
        local = Path(local_dir)
        local.mkdir(parents=True, exist_ok=True)
        items = self.list_remote()
        if not items:
            raise SyncError(f"nothing to download: no objects under {self.where}")
        for rel in items:  # every key checked before any is fetched
            try:
                inside(local, rel)
            except UnsafePathError as e:
                raise SyncError(f"{self.where}: refusing object key {join_key(self.prefix, rel)!r} "
                                f"for {local}: {e.reason}") from None
        stats = self._run(items, self._download_one, local, "s3 down")
        log.info("s3 down %s -> %s: %d files (%d fetched, %d already there), %.1f MB/s",
                 self.where, local, stats.files, stats.transferred, stats.skipped, stats.mb_per_s)
        return stats

    def upload(self, local_dir: str | Path) -> SyncStats:
        """Upload every file under `local_dir` (skipping objects that already match, by sha256)."""
        local = Path(local_dir)
        if not local.is_dir():
            raise SyncError(f"{local}: not a directory")
        items = {str(p.relative_to(local)): p.stat().st_size for p in sorted(local.rglob("*"))
                 if p.is_file() and not p.name.endswith(PART_SUFFIX) and not p.name.startswith(".")
                 and (self.include is None or self.include(str(p.relative_to(local))))}
        if not items:
            raise SyncError(f"nothing to upload: {local} has no files")
        stats = self._run(items, self._upload_one, local, "s3 up")
        log.info("s3 up %s -> %s: %d files (%d sent, %d already there), %.1f MB/s",
                 local, self.where, stats.files, stats.transferred, stats.skipped, stats.mb_per_s)
        return stats
