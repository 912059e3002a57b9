"""Subcommand `eval` (and the pipeline stage of the same name, trainer/eval/stage.py).

    python -m trainer eval files/runs/NAME.yml [--checkpoint DIR]

Offline tau (mean + histogram) of a checkpoint with greedy verification by the target; the result is
printed and written to ``<run_dir>/eval/step-NNNNNNN.json``.
"""
from __future__ import annotations

import argparse

from trainer.cli_args import add_run_config_args, load_from_args
from trainer.eval.stage import stage


def _cmd(args: argparse.Namespace) -> int:
    from trainer.dflash.stage import check_target_config

    cfg = load_from_args(args)
    check_target_config(cfg)  # a config.json transformers cannot read: one line, exit 2
    return stage(cfg, args.checkpoint)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="Offline acceptance length of a checkpoint")
    add_run_config_args(p)
    p.add_argument("--checkpoint", default=None,
                   help="a step-NNNNNNN dir, or a dir holding them (default: the run's latest checkpoint)")
    p.set_defaults(func=_cmd)
