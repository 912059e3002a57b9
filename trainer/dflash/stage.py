"""The `train` stage: train the DFlash drafter, under torchrun when the placement asks for more than one
process (`trainer.dflash.launch`: one rank per GPU, each running `python -m trainer train <resolved
config> --resume`). Heavy imports (torch) happen inside the functions.
"""
from __future__ import annotations

import logging

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
