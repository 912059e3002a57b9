"""The `train` stage: train the DFlash drafter, under torchrun when the placement asks for more than one
process (`trainer.dflash.launch`: one rank per GPU, each running `python -m trainer train <resolved
config> --resume`). Heavy imports (torch) happen inside the functions.
"""
from __future__ import annotations

import logging

from trainer.config import ConfigError, RunConfig

log = logging.getLogger(__name__)

EXIT_REFUSED = 1  # the data is refused, as from `doctor` and `prepare`


def torchrun_command(cfg: RunConfig, node_rank: int | None = None) -> list[str]:
    """The torchrun line the train stage runs for this resolved config (`node_rank`: this node's rank
    instead of the placement's). Writes the resolved config the line names, as the stage does."""
    import dataclasses

    from trainer.dflash.launch import resolved_launch

    p = cfg.train.placement
    if node_rank is not None:
        try:
            p = dataclasses.replace(p, node_rank=node_rank)
        except ValueError as e:
            raise ConfigError(f"--node-rank {node_rank}: {e}") from None
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, placement=p))
    if not p.launches_torchrun:
        raise ConfigError(f"--print-torchrun: run {cfg.name} trains in one process (train.placement: "
                          f"{p.nnodes} node x {p.nproc_per_node} process), the stage starts no torchrun; "
                          "set train.placement.nproc_per_node (or nnodes) for more")
    return resolved_launch(cfg)


def stage(cfg: RunConfig, resume: bool = True) -> int:
    """The `train` stage: resumes from the run's latest checkpoint when there is one.

    0 done, 1 data refused, 130 stopped by SIGINT/SIGTERM after a checkpoint, else a failed rank's code.
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
        return EXIT_REFUSED
    if result.interrupted:
        log.warning("train: stopped by a signal at step %d/%d after a checkpoint%s", result.step,
                    result.total_steps, f" ({result.checkpoint})" if result.checkpoint else "")
        return 130
    log.info("train: %d/%d steps, last log %s, export %s", result.step, result.total_steps, result.last_log,
             result.export)
    return 0
