"""Subcommand `train` (and the pipeline stage of the same name, trainer/dflash/stage.py).

    python -m trainer train files/runs/NAME.yml [--set train.lr=1e-4] [--resume | --fresh]

A run dir that holds an earlier train run (checkpoints, metrics, an export) is refused without --resume
(continue from its latest checkpoint) or --fresh (move its outputs aside, timestamped, and start at step
0): a plain restart would write over them.

When `train.placement` asks for more than one process, the stage starts torchrun itself
(`trainer.dflash.launch`): one rank per GPU, each running `python -m trainer train <resolved config>
--resume`. `--print-torchrun` writes the resolved config (run file + --overrides + --set) and prints the
same command line, built by the same function, without running it.
"""
from __future__ import annotations

import argparse

from trainer.cli_args import add_run_config_args, load_from_args
from trainer.config import ConfigError
from trainer.dflash.launch import in_torchrun
from trainer.dflash.stage import preflight, refuse_restart, set_aside, stage, torchrun_command


def _cmd(args: argparse.Namespace) -> int:
    if args.node_rank is not None and not args.print_torchrun:
        raise ConfigError("--node-rank: only with --print-torchrun; for a run, set "
                          f"--set train.placement.node_rank={args.node_rank}")
    if args.resume and args.print_torchrun:
        raise ConfigError("--resume: not with --print-torchrun (the printed line always resumes)")
    if args.fresh and (args.resume or args.print_torchrun):
        raise ConfigError("--fresh: not with " + ("--resume" if args.resume else "--print-torchrun"))
    cfg = load_from_args(args)
    if args.print_torchrun:
        print(" ".join(torchrun_command(cfg, args.node_rank)))
        return 0
    if not in_torchrun():
        preflight(cfg, args.resume)  # before --fresh moves anything
    if args.fresh:
        set_aside(cfg)
    elif not args.resume and not in_torchrun():
        refuse_restart(cfg)
    return stage(cfg, resume=args.resume)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="Train the DFlash drafter")
    add_run_config_args(p)
    p.add_argument("--resume", action="store_true", help="continue from the run's latest checkpoint")
    p.add_argument("--fresh", action="store_true",
                   help="start at step 0: move an earlier run's checkpoints, metrics, export and eval "
                   "results aside to <run_dir>/set-aside/train-<UTC time> first (nothing is deleted)")
    p.add_argument("--print-torchrun", action="store_true",
                   help="write the resolved config (<run_dir>/launch/config.yml) and print the torchrun "
                   "command the stage runs on it; refused when the placement is one process")
    p.add_argument("--node-rank", type=int, default=None,
                   help="with --print-torchrun: this node's rank (default: train.placement.node_rank)")
    p.set_defaults(func=_cmd)
