"""The `prepare` stage (completions -> Arrow shards + the doctor's verdict) and the bodies of `doctor`
and `sync`, which trainer/data/cli.py only parses arguments for.

Heavy imports (transformers, boto3, pyarrow) happen inside the functions so `--help` stays instant.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

from trainer.config import RunConfig, S3Config
from trainer.data.config import DoctorConfig
from trainer.layout import RunLayout

EXIT_REFUSED = 1
EXIT_ERROR = 2


def s3_sync(s3: S3Config, url: str, concurrency: int | None = None, include: Any = None) -> Any:
    """An `S3Sync` of `url` (s3://bucket/prefix) with a connection pool sized for its concurrency."""
    from trainer.data.sync import S3Sync
    from trainer.s3 import make_client, parse_s3_url

    bucket, prefix = parse_s3_url(url)
    conc = concurrency or s3.concurrency
    client = make_client(s3, max_pool_connections=conc * 8 + 4)
    return S3Sync(client, bucket, prefix, concurrency=conc, include=include)


def stage(cfg: RunConfig) -> int:
    """prepare: fetch completions (if on S3), tokenise into shards, run the doctor, upload if asked."""
    from trainer.data import fresh
    from trainer.data.prepare import prepare
    from trainer.data.records import DataError
    from trainer.data.sync import SyncError
    from trainer.s3 import join_key

    layout = RunLayout.of(cfg)
    data = cfg.data
    out = layout.shards
    try:
        src = local_completions(cfg, layout)
        tokenizer = data.tokenizer or cfg.target.path
        result = prepare(src, out, tokenizer, max_length=data.max_length,
                         num_workers=data.num_workers, rows_per_shard=data.rows_per_shard,
                         drop_degenerate=data.drop_degenerate, doctor=data.doctor,
                         heldout_share=data.heldout_share, heldout_dir=layout.heldout_shards,
                         inputs=fresh.inputs(src, tokenizer, data, layout.heldout_shards),
                         max_line_bytes=data.max_line_bytes)
        report(result, out, layout.heldout_shards)
        if not result.verdict.passed:
            from trainer.data.doctor import refused_flags

            flags = " ".join(f"{f} ..." for f in refused_flags(result.verdict.reasons))
            print(f"prepare: the doctor REFUSED {out}: {'; '.join(result.verdict.reasons)}; `train` will not "
                  f"use it. Fix the data, or re-judge it with `python -m trainer doctor {out} {flags}`",
                  file=sys.stderr)
            return EXIT_REFUSED
        if data.upload_shards:
            if not cfg.s3.enabled:
                print("error: data.upload_shards is set but s3.bucket is empty", file=sys.stderr)
                return EXIT_ERROR
            for local, rel in ((out, data.shards), (layout.heldout_shards, data.heldout_shards)):
                if local == out or result.heldout is not None:
                    url = f"s3://{cfg.s3.bucket}/{join_key(cfg.s3.prefix, rel)}"
                    upload_manifest_last(cfg.s3, local, url)
    except (DataError, SyncError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR
    return 0


def upload_manifest_last(s3: S3Config, local: Path, url: str, concurrency: int | None = None) -> Any:
    """Upload a dir whose manifest.json says what is whole (a shards dir) so that the manifest is never
    on S3 beside files it does not describe: an S3 manifest that lists other files than the local one is
    deleted first, then every other file is uploaded (verified), then manifest.json. A reader (the train
    launcher of another node, trainer/data/shard_fetch.py) that finds no manifest knows the copy is
    incomplete. A dir without manifest.json is uploaded as it is. -> the stats of both uploads."""
    from trainer.data.shards import MANIFEST
    from trainer.data.sync import SyncError
    from trainer.s3 import join_key

    if not (local / MANIFEST).is_file():
        return s3_sync(s3, url, concurrency).upload(local)
    syncer = s3_sync(s3, url, concurrency)
    key = join_key(syncer.prefix, MANIFEST)
    try:
        there = syncer.client.get_object(Bucket=syncer.bucket, Key=key)["Body"].read()
    except Exception as e:
        if str((getattr(e, "response", None) or {}).get("Error", {}).get("Code", "")) not in (
                "NoSuchKey", "404", "NotFound"):
            raise SyncError(f"cannot read s3://{syncer.bucket}/{key} ({syncer.where}): {e}") from e
        there = None
    if there is not None and _describes_other_files(there, (local / MANIFEST).read_bytes()):
        syncer.client.delete_object(Bucket=syncer.bucket, Key=key)
    syncer.include = lambda rel: rel != MANIFEST
    files = syncer.upload(local)
    syncer.include = lambda rel: rel == MANIFEST
    last = syncer.upload(local)
    for f in ("files", "transferred", "skipped", "bytes", "retries", "unverified", "seconds"):
        setattr(last, f, getattr(last, f) + getattr(files, f))
    return last


def _describes_other_files(there: bytes, here: bytes) -> bool:
    """Does the S3 manifest `there` describe other files than the local `here` (trainer.data.shard_fetch
    `content`)? The same data prepared again, or on another node, only differs in when and where: its
    manifest is replaced in one PUT, never deleted, so a node fetching meanwhile never finds none."""
    import json

    from trainer.data.shard_fetch import ShardFetchError, content

    try:
        return content(json.loads(there), "s3") != content(json.loads(here), "local")
    except (ValueError, ShardFetchError):
        return True


def local_completions(cfg: RunConfig, layout: RunLayout) -> str:
    """prepare's input as a local path: completions on S3 are downloaded (only what is not here yet)."""
    from trainer.data.records import is_completion_file

    src = layout.completions
    if src.startswith("s3://"):
        s3_sync(cfg.s3, src, include=is_completion_file).download(layout.fetched_completions)
        return str(layout.fetched_completions)
    return src


def up_to_date(cfg: RunConfig) -> str | None:
    """Why `run` may skip prepare: its shards are complete, made from these very completions, tokenizer
    and settings, and passed by the doctor (trainer/data/fresh.py); None when it must run."""
    from trainer.data import fresh
    from trainer.data.records import DataError
    from trainer.data.sync import SyncError

    layout = RunLayout.of(cfg)
    if not layout.shards_manifest.exists():
        return None
    try:
        src = local_completions(cfg, layout)
        want = fresh.inputs(src, cfg.data.tokenizer or cfg.target.path, cfg.data, layout.heldout_shards)
    except (DataError, SyncError, OSError):
        return None  # the stage itself reports what is wrong
    return fresh.done_reason(layout.shards, layout.heldout_shards, want)


def report(result: Any, out: Path, heldout: Path) -> None:
    """The doctor's report on the training shards (what `train` is gated on), then on the held-out ones."""
    print(result.verdict.report, end="")
    counts = result.manifest["counts"]
    print(f"prepare: {counts['samples']} samples -> {counts['rows']} rows, {counts['tokens']} tokens "
          f"in {len(result.manifest['shards'])} shards at {out} ({result.seconds:.1f}s)")
    if result.heldout is None:
        print("prepare: no held-out split (data.heldout_share 0): eval scores samples training saw")
        return
    manifest, verdict = result.heldout
    held = manifest["counts"]
    print(f"prepare: held out {held['records']} conversations ({held['rows']} rows, data.heldout_share "
          f"{manifest['heldout_share']}) at {heldout}; training never reads them. Their doctor report "
          f"(informational, training is gated on the report above):")
    print(verdict.report, end="")


def doctor(data: Path, cfg: DoctorConfig, *, tokenizer: str | None = None, max_length: int = 4096,
           workers: int = 0, record: bool = True) -> Any:
    """The doctor's verdict on a shards dir (recorded in its manifest when `record`), or on raw
    completions tokenised with `tokenizer` into a scratch dir. DataError for anything else."""
    from trainer.data.doctor import diagnose
    from trainer.data.records import DataError
    from trainer.data.shards import MANIFEST, data_digest, read_manifest, read_samples, write_json_atomic

    if (data / MANIFEST).exists():
        manifest = read_manifest(data)
        verdict = diagnose(read_samples(data), cfg)
        if record:
            manifest["doctor"] = verdict.to_json(data_digest(manifest["shards"]), cfg)
            write_json_atomic(data / MANIFEST, manifest)
        return verdict
    if not tokenizer:
        raise DataError(f"{data} is not a shards dir (no {MANIFEST}); to check raw completions give "
                        f"--tokenizer DIR")
    from trainer.data.prepare import prepare

    with tempfile.TemporaryDirectory(prefix="doctor-") as tmp:
        return prepare(data, tmp, tokenizer, max_length=max_length, doctor=cfg, num_workers=workers).verdict


def sync(direction: str, local: str | Path, url: str, s3: S3Config, concurrency: int | None = None) -> str:
    """Download (`down`) or upload (`up`) a directory; -> the one-line report."""
    if direction == "up":
        stats = upload_manifest_last(s3, Path(local), url, concurrency)
    else:
        stats = s3_sync(s3, url, concurrency).download(local)
    return (f"sync {direction}: {stats.files} files, {stats.transferred} transferred, "
            f"{stats.skipped} already in place, {stats.bytes / 1e6:.1f} MB in {stats.seconds:.1f}s "
            f"({stats.mb_per_s:.1f} MiB/s), {stats.retries} retries, "
            f"{stats.unverified} verified by size only")
