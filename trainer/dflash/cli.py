"""Subcommand `train` (and the pipeline stage of the same name, trainer/dflash/stage.py).

    python -m trainer train files/runs/NAME.yml [--set train.lr=1e-4] [--resume]

When `train.placement` asks for more than one process, the stage starts torchrun itself
(`trainer.dflash.launch`): one rank per GPU, each running `python -m trainer train <resolved config>
--resume`. `--print-torchrun` prints that command line without running it.
"""
from __future__ import annotations

import argparse

from trainer.cli import add_run_config_args, load_from_args
from trainer.dflash.stage import stage, torchrun_command


def _cmd(args: argparse.Namespace) -> int:
    cfg = load_from_args(args)
    if args.print_torchrun:
        print(" ".join(torchrun_command(cfg, args.config, args.node_rank)))
        return 0
    return stage(cfg, resume=args.resume)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="Train the DFlash drafter")
    add_run_config_args(p)
    p.add_argument("--resume", action="store_true", help="continue from the run's latest checkpoint")
    p.add_argument("--print-torchrun", action="store_true",
                   help="print the torchrun command for this run's placement and exit")
    p.add_argument("--node-rank", type=int, default=None,
                   help="with --print-torchrun: this node's rank (default: train.placement.node_rank)")
    p.set_defaults(func=_cmd)
