"""Subcommand `train` (and the pipeline stage of the same name).

    python -m trainer train files/runs/NAME.yml [--set train.lr=1e-4] [--resume]

Under torchrun every rank runs this same command (see `torchrun_command` for the multi-node line
built from `train.placement`).
"""
from __future__ import annotations

import argparse
import logging

from trainer.cli import add_run_config_args, load_from_args
from trainer.config import RunConfig

log = logging.getLogger(__name__)


def torchrun_command(cfg: RunConfig, config_path: str, node_rank: int = 0, resume: bool = False) -> list[str]:
    """The torchrun line for this run: nodes and GPUs from `train.placement`, c10d rendezvous."""
    p = cfg.train.placement
    cmd = [
        "torchrun", f"--nnodes={p.nnodes}", f"--nproc-per-node={p.nproc_per_node}",
        "--rdzv-backend=c10d", f"--rdzv-endpoint={p.rdzv_endpoint}", f"--rdzv-id={p.rdzv_id or cfg.name}",
        f"--node-rank={node_rank}", "-m", "trainer", "train", config_path,
    ]
    return [*cmd, "--resume"] if resume else cmd


def stage(cfg: RunConfig, resume: bool = True) -> int:
    """The `train` stage: resumes from the run's latest checkpoint when there is one."""
    from trainer.data.shards import DataRefused
    from trainer.dflash.loop import train

    try:
        result = train(cfg, resume=resume)
    except DataRefused as e:
        log.error("train refused: %s", e)
        return 3
    log.info("train: %d/%d steps, last log %s, export %s", result.step, result.total_steps, result.last_log,
             result.export)
    return 0


def _cmd(args: argparse.Namespace) -> int:
    cfg = load_from_args(args)
    if args.print_torchrun:
        print(" ".join(torchrun_command(cfg, args.config, args.node_rank, args.resume)))
        return 0
    return stage(cfg, resume=args.resume)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="Train the DFlash drafter")
    add_run_config_args(p)
    p.add_argument("--resume", action="store_true", help="continue from the run's latest checkpoint")
    p.add_argument("--print-torchrun", action="store_true",
                   help="print the torchrun command for this run's placement and exit")
    p.add_argument("--node-rank", type=int, default=0, help="with --print-torchrun: this node's rank")
    p.set_defaults(func=_cmd)
