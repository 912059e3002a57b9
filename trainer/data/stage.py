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
    from trainer.data.prepare import prepare
    from trainer.data.records import DataError, is_completion_file
    from trainer.data.sync import SyncError
    from trainer.s3 import join_key

    layout = RunLayout.of(cfg)
    data = cfg.data
    src = layout.completions
    out = layout.shards
    try:
        if src.startswith("s3://"):
            local = layout.fetched_completions
            s3_sync(cfg.s3, src, include=is_completion_file).download(local)
            src = str(local)
        result = prepare(src, out, data.tokenizer or cfg.target.path, max_length=data.max_length,
                         num_workers=data.num_workers, rows_per_shard=data.rows_per_shard,
                         drop_degenerate=data.drop_degenerate, doctor=data.doctor)
        print(result.verdict.report, end="")
        counts = result.manifest["counts"]
        print(f"prepare: {counts['samples']} samples -> {counts['rows']} rows, {counts['tokens']} tokens "
              f"in {len(result.manifest['shards'])} shards at {out} ({result.seconds:.1f}s)")
        if not result.verdict.passed:
            print(f"prepare: the doctor REFUSED {out}; `train` will not use it. Fix the data, or re-judge "
                  f"it with `python -m trainer doctor {out} --max-degenerate-share ...`", file=sys.stderr)
            return EXIT_REFUSED
        if data.upload_shards:
            if not cfg.s3.enabled:
                print("error: data.upload_shards is set but s3.bucket is empty", file=sys.stderr)
                return EXIT_ERROR
            url = f"s3://{cfg.s3.bucket}/{join_key(cfg.s3.prefix, data.shards)}"
            s3_sync(cfg.s3, url).upload(out)
    except (DataError, SyncError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR
    return 0


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
    syncer = s3_sync(s3, url, concurrency)
    stats = (syncer.download if direction == "down" else syncer.upload)(local)
    return (f"sync {direction}: {stats.files} files, {stats.transferred} transferred, "
            f"{stats.skipped} already in place, {stats.bytes / 1e6:.1f} MB in {stats.seconds:.1f}s "
            f"({stats.mb_per_s:.1f} MiB/s), {stats.retries} retries, "
            f"{stats.unverified} verified by size only")
