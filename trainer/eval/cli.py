"""Subcommand `eval` (and the pipeline stage of the same name)."""
from __future__ import annotations

import argparse

from trainer.cli import add_run_config_args, load_from_args
from trainer.config import RunConfig


def stage(cfg: RunConfig) -> int:
    raise NotImplementedError("eval: not implemented yet")


def _cmd(args: argparse.Namespace) -> int:
    return stage(load_from_args(args))


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="Offline acceptance length of a checkpoint")
    add_run_config_args(p)
    p.set_defaults(func=_cmd)
