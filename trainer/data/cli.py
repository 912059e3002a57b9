"""Subcommand `prepare` (and the pipeline stage of the same name)."""
from __future__ import annotations

import argparse

from trainer.cli import add_run_config_args, load_from_args
from trainer.config import RunConfig


def stage(cfg: RunConfig) -> int:
    raise NotImplementedError("prepare: not implemented yet")


def _cmd(args: argparse.Namespace) -> int:
    return stage(load_from_args(args))


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("prepare", help="Tokenise completions into Arrow shards and run the doctor")
    add_run_config_args(p)
    p.set_defaults(func=_cmd)
