"""Subcommand `train` (and the pipeline stage of the same name).

    python -m trainer train files/runs/NAME.yml [--set train.lr=1e-4] [--resume]

When `train.placement` asks for more than one process, the stage starts torchrun itself
(`trainer.dflash.launch`): one rank per GPU, each running `python -m trainer train <resolved config>
--resume`. `--print-torchrun` prints that command line without running it.
"""
from __future__ import annotations

import argparse
import logging

from trainer.cli import add_run_config_args, load_from_args
from trainer.config import RunConfig

log = logging.getLogger(__name__)


def torchrun_command(cfg: RunConfig, config_path: str, node_rank: int | None = None,
                     resume: bool = True) -> list[str]:
    """The torchrun line this run's train stage executes (`node_rank` overrides the placement's)."""
    import dataclasses

    from trainer.dflash.launch import launch_command

    if node_rank is not None:
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(
            cfg.train, placement=dataclasses.replace(cfg.train.placement, node_rank=node_rank)))
    cmd = launch_command(cfg, config_path)
    return cmd if resume else cmd[:-1]


def stage(cfg: RunConfig, resume: bool = True) -> int:
    """The `train` stage: resumes from the run's latest checkpoint when there is one.

    0 done, 3 data refused, 130 stopped by SIGINT/SIGTERM after a checkpoint, else a failed rank's code.
    """
    from trainer.dflash.launch import in_torchrun, launch

    if cfg.train.placement.launches_torchrun and not in_torchrun():
        return launch(cfg)
    from trainer.data.shards import DataRefused
    from trainer.dflash.loop import train

    try:
        result = train(cfg, resume=resume)
    except DataRefused as e:
        log.error("train refused: %s", e)
        return 3
    if result.interrupted:
        log.warning("train: stopped by a signal at step %d/%d after a checkpoint%s", result.step,
                    result.total_steps, f" ({result.checkpoint})" if result.checkpoint else "")
        return 130
    log.info("train: %d/%d steps, last log %s, export %s", result.step, result.total_steps, result.last_log,
             result.export)
    return 0


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
