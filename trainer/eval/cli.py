"""Subcommand `eval` (and the pipeline stage of the same name).

    python -m trainer eval files/runs/NAME.yml [--checkpoint DIR]

Offline tau (mean + histogram) of a checkpoint with greedy verification by the target; the result is
printed and written to ``<run_dir>/eval/step-NNNNNNN.json``.
"""
from __future__ import annotations

import argparse
import logging

from trainer.cli import add_run_config_args, load_from_args
from trainer.config import RunConfig

log = logging.getLogger(__name__)


def stage(cfg: RunConfig, checkpoint: str | None = None) -> int:
    """Evaluate `checkpoint` (default: the run's latest)."""
    from trainer.eval.acceptance import evaluate, format_result, write_result

    try:
        res = evaluate(cfg, checkpoint)
    except FileNotFoundError as e:
        log.error("eval: %s", e)
        return 2
    print(format_result(res))
    log.info("eval result written to %s", write_result(cfg, res))
    return 0


def _cmd(args: argparse.Namespace) -> int:
    return stage(load_from_args(args), args.checkpoint)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="Offline acceptance length of a checkpoint")
    add_run_config_args(p)
    p.add_argument("--checkpoint", default=None,
                   help="a step-NNNNNNN dir, or a dir holding them (default: the run's latest checkpoint)")
    p.set_defaults(func=_cmd)
