"""Subcommands `prepare` (the pipeline stage), `doctor` and `sync` of `python -m trainer`.

    python -m trainer prepare RUN.yml          completions -> shards + manifest; runs the doctor
    python -m trainer doctor DATA              report on a shards dir (or raw completions with --tokenizer);
                                               exit 1 when the data is refused
    python -m trainer sync down|up LOCAL s3://bucket/prefix [--config RUN.yml]

Heavy imports (transformers, boto3, pyarrow) happen inside the commands so `--help` stays instant.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

from trainer.cli import add_run_config_args, load_from_args
from trainer.config import RunConfig, S3Config, load_run_config
from trainer.data.config import DoctorConfig

EXIT_REFUSED = 1
EXIT_ERROR = 2


def _sync(s3: S3Config, url: str, concurrency: int | None = None, include: object = None) -> object:
    from trainer.data.sync import S3Sync
    from trainer.s3 import make_client, parse_s3_url

    bucket, prefix = parse_s3_url(url)
    conc = concurrency or s3.concurrency
    client = make_client(s3, max_pool_connections=conc * 8 + 4)
    return S3Sync(client, bucket, prefix, concurrency=conc, include=include)  # type: ignore[arg-type]


def stage(cfg: RunConfig) -> int:
    """prepare: fetch completions (if on S3), tokenise into shards, run the doctor, upload if asked."""
    from trainer.data.prepare import prepare
    from trainer.data.records import DataError, is_completion_file
    from trainer.data.sync import SyncError
    from trainer.s3 import join_key

    run = cfg.run_path
    data = cfg.data
    src = data.completions or str(run / cfg.generate.output)
    out = run / data.shards
    try:
        if src.startswith("s3://"):
            local = run / "completions"
            _sync(cfg.s3, src, include=is_completion_file).download(local)  # type: ignore[attr-defined]
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
            _sync(cfg.s3, url).upload(out)  # type: ignore[attr-defined]
    except (DataError, SyncError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR
    return 0


def _cmd_prepare(args: argparse.Namespace) -> int:
    return stage(load_from_args(args))


_THRESHOLDS = {f.name: f.type for f in dataclasses.fields(DoctorConfig)}


def _doctor_config(args: argparse.Namespace) -> DoctorConfig:
    base = load_run_config(args.config).data.doctor if args.config else DoctorConfig()
    changes = {k: getattr(args, k) for k in _THRESHOLDS if getattr(args, k) is not None}
    return dataclasses.replace(base, **changes)


def _cmd_doctor(args: argparse.Namespace) -> int:
    from trainer.data.doctor import diagnose
    from trainer.data.records import DataError
    from trainer.data.shards import MANIFEST, DataRefused, data_digest, read_manifest, read_samples

    try:
        cfg = _doctor_config(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR
    data = Path(args.data)
    try:
        if (data / MANIFEST).exists():
            manifest = read_manifest(data)
            verdict = diagnose(read_samples(data), cfg)
            if not args.dry_run:
                from trainer.data.shards import write_json_atomic

                manifest["doctor"] = verdict.to_json(data_digest(manifest["shards"]), cfg)
                write_json_atomic(data / MANIFEST, manifest)
        else:
            if not args.tokenizer:
                print(f"error: {data} is not a shards dir (no {MANIFEST}); to check raw completions give "
                      f"--tokenizer DIR", file=sys.stderr)
                return EXIT_ERROR
            from trainer.data.prepare import prepare

            with tempfile.TemporaryDirectory(prefix="doctor-") as tmp:
                verdict = prepare(data, tmp, args.tokenizer, max_length=args.max_length, doctor=cfg,
                                  num_workers=args.workers).verdict
    except (DataError, DataRefused) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR
    if args.json:
        print(json.dumps({"passed": verdict.passed, "reasons": list(verdict.reasons), "stats": verdict.stats},
                         indent=2))
    else:
        print(verdict.report, end="")
    return 0 if verdict.passed else EXIT_REFUSED


def _cmd_sync(args: argparse.Namespace) -> int:
    from trainer.data.sync import SyncError

    s3 = load_run_config(args.config).s3 if args.config else S3Config()
    changes = {k: v for k, v in (("endpoint_url", args.endpoint_url), ("region", args.region)) if v}
    s3 = dataclasses.replace(s3, **changes)
    try:
        syncer = _sync(s3, args.url, args.concurrency)
        stats = (syncer.download if args.direction == "down" else syncer.upload)(args.local)  # type: ignore[attr-defined]
    except (SyncError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR
    print(f"sync {args.direction}: {stats.files} files, {stats.transferred} transferred, "
          f"{stats.skipped} already in place, {stats.bytes / 1e6:.1f} MB in {stats.seconds:.1f}s "
          f"({stats.mb_per_s:.1f} MiB/s), {stats.retries} retries, {stats.unverified} verified by size only")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("prepare", help="Tokenise completions into Arrow shards and run the doctor")
    add_run_config_args(p)
    p.set_defaults(func=_cmd_prepare)

    p = sub.add_parser("doctor", help="Report on a dataset; refuse it when too many samples are degenerate")
    p.add_argument("data", help="a shards dir (with manifest.json), or raw completions with --tokenizer")
    p.add_argument("--config", help="run config whose data.doctor thresholds to use")
    p.add_argument("--tokenizer", help="tokenizer dir, to check raw completions (jsonl / jsonl.zst)")
    p.add_argument("--max-length", type=int, default=4096, help="with --tokenizer: truncation length")
    p.add_argument("--workers", type=int, default=0, help="with --tokenizer: processes (0 = all cores)")
    p.add_argument("--dry-run", action="store_true", help="do not record the verdict in manifest.json")
    p.add_argument("--json", action="store_true", help="print the statistics as JSON")
    for name, tp in _THRESHOLDS.items():
        kind = float if tp in (float, "float") else int
        p.add_argument("--" + name.replace("_", "-"), dest=name, type=kind, default=None,
                       help=f"override data.doctor.{name}")
    p.set_defaults(func=_cmd_doctor)

    p = sub.add_parser("sync", help="Parallel, verified, resumable S3 download/upload of a directory")
    p.add_argument("direction", choices=["down", "up"])
    p.add_argument("local", help="local directory")
    p.add_argument("url", help="s3://bucket/prefix")
    p.add_argument("--config", help="run config whose s3: section (endpoint, region, concurrency) to use")
    p.add_argument("--endpoint-url", help="S3 endpoint (MinIO, R2, moto)")
    p.add_argument("--region")
    p.add_argument("--concurrency", type=int, help="files in flight (default s3.concurrency = 20)")
    p.set_defaults(func=_cmd_sync)
