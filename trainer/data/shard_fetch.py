"""Shards on every node of a run: with `data.upload_shards`, the node that ran `prepare` put its shards on
S3 (trainer.data.stage: every file first, manifest.json last), and every node's train launcher brings its
own copy up to date from there before torchrun starts, once per node:

    s3://<bucket>/<prefix>/<data.shards>/            shard-*.arrow, samples.arrow, then manifest.json
    s3://<bucket>/<prefix>/<data.heldout_shards>/    the same, when the manifest says a share is held out

- A local dir whose manifest.json lists the same files (name, size, sha256) and doctor's verdict as the
  S3 copy's, with every listed file at its size, is left alone.
- Otherwise the files the S3 manifest lists are fetched into a hidden dir beside the local one
  (`.<name>.fetch-<digest>`: a fetch cut short resumes there, trainer.data.sync skips what is whole),
  each is checked against that manifest (size and sha256), the manifest is written last, and the dir is
  renamed into place. An older local copy is moved aside to `.<name>.stale-<UTC time>`, never deleted.
- An S3 copy without manifest.json (an upload under way or cut short) is refused, naming its URL: no
  node trains on a partial or stale copy. On the other nodes of a multi-node run (node_rank > 0, which
  leave generate and prepare to node 0) the launcher waits for node 0's upload instead, up to
  train.placement.timeout_min, saying so each minute. The ranks then check that they all hold the same
  data (trainer.dflash.loop), so a copy fetched before node 0 replaced it is refused there.
Torch-free.
"""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from trainer.config import RunConfig
from trainer.data.shards import FORMAT_VERSION, MANIFEST, data_digest, sha256_file
from trainer.layout import RunLayout

log = logging.getLogger(__name__)


class ShardFetchError(RuntimeError):
    """The S3 copy of a shards dir cannot be trained from; the message names the URL or file at fault."""


class ShardsNotUploaded(ShardFetchError):
    """The S3 copy has no manifest.json (yet): an upload under way, cut short, or not started."""

# How often a node that waits for node 0's shards looks again.
WAIT_POLL_S = 5.0


def listed_files(manifest: dict[str, Any], where: str) -> dict[str, dict[str, Any]]:
    """name -> entry (bytes, sha256) of every file a shards manifest lists (the shards and samples.arrow)."""
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_VERSION:
        raise ShardFetchError(f"{where}: not a shards manifest of format {FORMAT_VERSION}")
    entries = [*(manifest.get("shards") or []), *([manifest["samples"]] if manifest.get("samples") else [])]
    out: dict[str, dict[str, Any]] = {}
    for f in entries:
        name = f.get("name") if isinstance(f, dict) else None
        if (not isinstance(name, str) or "/" in name or name in ("", ".", "..", MANIFEST)
                or not isinstance(f.get("bytes"), int) or not isinstance(f.get("sha256"), str)):
            raise ShardFetchError(f"{where}: a file entry is not {{name, bytes, sha256}}: {f!r}")
        out[name] = f
    if not out:
        raise ShardFetchError(f"{where}: lists no shard file")
    return out


def remote_manifest(client: Any, bucket: str, prefix: str) -> tuple[bytes, dict[str, Any]]:
    """The raw and parsed manifest.json of the S3 copy under `prefix`; ShardFetchError naming the URL when
    there is none (an upload cut short or under way) or it cannot be read."""
    from trainer.s3 import join_key

    url = f"s3://{bucket}/{join_key(prefix, MANIFEST)}"
    try:
        body = client.get_object(Bucket=bucket, Key=join_key(prefix, MANIFEST))["Body"].read()
    except Exception as e:
        code = str((getattr(e, "response", None) or {}).get("Error", {}).get("Code", ""))
        if code in ("NoSuchKey", "404", "NotFound"):
            raise ShardsNotUploaded(
                f"{url} does not exist: the S3 copy of the shards is incomplete (an upload cut short or "
                "still under way; the upload puts manifest.json last); run `python -m trainer prepare` "
                "again on the node that has the shards") from None
        raise ShardFetchError(f"{url}: cannot be read ({e})") from e
    try:
        manifest = json.loads(body)
    except ValueError as e:
        raise ShardFetchError(f"{url}: not JSON ({e})") from None
    listed_files(manifest, url)
    return body, manifest


def content(manifest: dict[str, Any], where: str) -> tuple[Any, ...]:
    """What a shards manifest says the data is: each file's name, size and sha256, and the doctor's
    verdict. Not where or when it was made (`seconds`, the source paths): the same completions prepared
    on two nodes give the same content, and neither copy needs replacing."""
    files = {n: (f["bytes"], f["sha256"]) for n, f in listed_files(manifest, where).items()}
    return files, json.dumps(manifest.get("doctor"), sort_keys=True)


def local_matches(local: Path, manifest: dict[str, Any]) -> bool:
    """Does `local` hold the content of this manifest (`content`), every file it lists at its size?
    (Sizes only: the sha256 of each file was checked when it was fetched or written, and train checks
    the doctor's digest of them.)"""
    try:
        here = json.loads((local / MANIFEST).read_bytes())
        if content(here, str(local / MANIFEST)) != content(manifest, MANIFEST):
            return False
    except (OSError, ValueError, ShardFetchError):
        return False
    for name, f in listed_files(manifest, str(local / MANIFEST)).items():
        try:
            if (local / name).stat().st_size != f["bytes"]:
                return False
        except OSError:
            return False
    return True


def fetch_dir(local: Path, client: Any, bucket: str, prefix: str, *,
              concurrency: int = 20) -> tuple[str, dict[str, Any]]:
    """Bring `local` up to date with the S3 copy under `prefix`: -> ("kept" | "fetched", its manifest)."""
    from trainer.data.sync import S3Sync, SyncError
    from trainer.s3 import join_key

    body, manifest = remote_manifest(client, bucket, prefix)
    url = f"s3://{bucket}/{prefix}"
    if local_matches(local, manifest):
        log.info("shards: %s matches %s; nothing fetched", local, url)
        return "kept", manifest
    files = listed_files(manifest, f"{url}/{MANIFEST}")
    local.parent.mkdir(parents=True, exist_ok=True)
    tmp = local.with_name(f".{local.name}.fetch-{data_digest(list(files.values()))[:12]}")
    (tmp / MANIFEST).unlink(missing_ok=True)  # the manifest marks a whole dir: written last, below
    try:
        S3Sync(client, bucket, prefix, concurrency=concurrency, show_progress=False,
               include=files.__contains__).download(tmp)
    except SyncError as e:
        raise ShardFetchError(f"fetching the shards from {url}: {e}") from None
    for name, f in sorted(files.items()):  # every file against the manifest read above, not S3's metadata
        path = tmp / name
        size = path.stat().st_size if path.is_file() else None
        if size != f["bytes"] or sha256_file(path) != f["sha256"]:
            raise ShardFetchError(
                f"s3://{bucket}/{join_key(prefix, name)}: does not match {url}/{MANIFEST} (size {size}, "
                f"listed {f['bytes']}, or its sha256 differs): the S3 copy changed during the fetch or is "
                f"damaged; the partial fetch stays in {tmp}")
    (tmp / MANIFEST).write_bytes(body)
    if local.exists():
        base = f".{local.name}.stale-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
        aside, n = local.with_name(base), 0
        while aside.exists():  # two fetches within one second
            n += 1
            aside = local.with_name(f"{base}.{n}")
        os.replace(local, aside)
        log.warning("shards: %s differed from %s; the old copy is kept at %s", local, url, aside)
    os.replace(tmp, local)
    log.info("shards: fetched %d files from %s into %s, each checked against its manifest",
             len(files), url, local)
    return "fetched", manifest


def ensure_shards(cfg: RunConfig, client: Any = None) -> dict[Path, str]:
    """The train launcher's step with `data.upload_shards` and S3 on: the run's shards (and held-out
    shards, when the S3 manifest holds a share out) up to date from S3; -> local dir -> "kept"/"fetched".
    Nothing to do (an empty dict) without upload_shards or S3."""
    from trainer.s3 import join_key, make_client

    if not (cfg.data.upload_shards and cfg.s3.enabled):
        return {}
    layout = RunLayout.of(cfg)
    s3 = cfg.s3
    client = client or make_client(s3, max_pool_connections=s3.concurrency * 8 + 4)
    done: dict[Path, str] = {}
    p = cfg.train.placement
    wait_s = p.timeout_min * 60.0 if p.nnodes > 1 and p.node_rank > 0 else 0.0
    outcome, manifest = _fetch_waiting(layout.shards, client, s3.bucket, join_key(s3.prefix, cfg.data.shards),
                                       s3.concurrency, wait_s, f"node {p.node_rank} of {p.nnodes}")
    done[layout.shards] = outcome
    if (manifest.get("heldout") or {}).get("share"):
        done[layout.heldout_shards] = fetch_dir(
            layout.heldout_shards, client, s3.bucket, join_key(s3.prefix, cfg.data.heldout_shards),
            concurrency=s3.concurrency)[0]
    return done


def _fetch_waiting(local: Path, client: Any, bucket: str, prefix: str, concurrency: int, wait_s: float,
                   who: str) -> tuple[str, dict[str, Any]]:
    """fetch_dir, waiting up to `wait_s` for an S3 copy that has no manifest yet (node 0 still preparing)."""
    deadline = time.monotonic() + wait_s
    said = 0.0
    while True:
        try:
            return fetch_dir(local, client, bucket, prefix, concurrency=concurrency)
        except ShardsNotUploaded as e:
            now = time.monotonic()
            if now >= deadline:
                if wait_s:
                    raise ShardsNotUploaded(f"{e} (waited {wait_s / 60:g} min, train.placement.timeout_min, "
                                            f"for node 0 to upload them)") from None
                raise
            if now - said >= 60.0:
                log.info("shards: %s waits for node 0's shards at s3://%s/%s (generate and prepare run on "
                         "node 0; up to %.0f min more)", who, bucket, prefix, (deadline - now) / 60)
                said = now
            time.sleep(min(WAIT_POLL_S, max(deadline - now, 0.0)))
