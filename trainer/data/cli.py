"""Subcommands `prepare` (the pipeline stage), `doctor` and `sync` of `python -m trainer`.

    python -m trainer prepare RUN.yml          completions -> shards + manifest; runs the doctor
    python -m trainer doctor DATA|RUN.yml      report on a shards dir (or raw completions with --tokenizer,
                                               or a run's shards); exit 1 when the data is refused
    python -m trainer sync down|up LOCAL s3://bucket/prefix [--config RUN.yml]

The bodies live in trainer/data/stage.py; this module only parses arguments. Heavy imports happen
inside the commands so `--help` stays instant.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from trainer.cli_args import add_run_config_args, load_from_args
from trainer.config import ConfigError, S3Config, load_run_config
from trainer.data.config import DoctorConfig
from trainer.data.stage import EXIT_ERROR, EXIT_REFUSED, doctor, stage, sync

_THRESHOLDS = {f.name: f.type for f in dataclasses.fields(DoctorConfig)}


def _cmd_prepare(args: argparse.Namespace) -> int:
    return stage(load_from_args(args))


def _doctor_config(args: argparse.Namespace) -> DoctorConfig:
    base = load_run_config(args.config).data.doctor if args.config else DoctorConfig()
    changes = {k: getattr(args, k) for k in _THRESHOLDS if getattr(args, k) is not None}
    return dataclasses.replace(base, **changes)


def _cmd_doctor(args: argparse.Namespace) -> int:
    from trainer.data.records import DataError
    from trainer.data.shards import DataRefused

    if str(args.data).endswith((".yml", ".yaml")):  # a run file: its shards, with its thresholds
        if args.config:
            raise ConfigError("--config: not with a run file as DATA (its data.doctor thresholds are used)")
        from trainer.layout import RunLayout

        args.config = args.data
        args.data = str(RunLayout.of(load_run_config(args.config)).shards)
    if not args.tokenizer:
        given = [flag for flag, v in (("--max-length", args.max_length), ("--workers", args.workers))
                 if v is not None]
        if given:
            raise ConfigError(f"{given[0]}: only with --tokenizer (it applies to raw completions; a shards "
                              "dir keeps the length it was prepared with)")
    try:
        verdict = doctor(Path(args.data), _doctor_config(args), tokenizer=args.tokenizer,
                         max_length=args.max_length or 4096, workers=args.workers or 0,
                         record=not args.dry_run)
    except (DataError, DataRefused, ValueError) as e:
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
    try:
        s3 = dataclasses.replace(s3, **changes)
        print(sync(args.direction, args.local, args.url, s3, args.concurrency))
    except (SyncError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("prepare", help="Tokenise completions into Arrow shards and run the doctor")
    add_run_config_args(p)
    p.set_defaults(func=_cmd_prepare)

    p = sub.add_parser("doctor", help="Report on a dataset; refuse it when too many samples are degenerate")
    p.add_argument("data", help="a shards dir (with manifest.json), raw completions with --tokenizer, or a "
                   "run file (RUN.yml: its shards, with its data.doctor thresholds)")
    p.add_argument("--config", help="run config whose data.doctor thresholds to use")
    p.add_argument("--tokenizer", help="tokenizer dir, to check raw completions (jsonl / jsonl.zst)")
    p.add_argument("--max-length", type=int, default=None,
                   help="with --tokenizer: truncation length (default 4096)")
    p.add_argument("--workers", type=int, default=None, help="with --tokenizer: processes (0 = all cores)")
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
