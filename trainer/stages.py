"""A run's stages in order (generate -> prepare -> train -> eval), as `python -m trainer run` and
`quickstart` run them. Each stage's body is ``trainer/<component>/stage.py: stage(cfg) -> int``."""
from __future__ import annotations

import importlib
import logging

from trainer.config import RunConfig

# stage name -> module exposing `stage(cfg) -> int`
STAGES = {
    "generate": "trainer.generate.stage",
    "prepare": "trainer.data.stage",
    "train": "trainer.dflash.stage",
    "eval": "trainer.eval.stage",
}

log = logging.getLogger("trainer")


# What the other nodes of a multi-node run leave to node 0: one node regenerates, prepares (uploading the
# shards with data.upload_shards, which the others fetch before training) and evaluates the export that
# global rank 0 writes; every node takes part in train.
NODE0_ONLY = ("generate", "prepare", "eval")


def run_stages(cfg: RunConfig, force: bool = False) -> int:
    """Run the stages of `cfg` in order; the exit code of the first that fails, else 0."""
    p = cfg.train.placement
    for name in cfg.stages:
        if p.nnodes > 1 and p.node_rank > 0 and name in NODE0_ONLY:
            log.info("run %s: stage %s skipped: node 0 runs it (this is node %d of %d)", cfg.name, name,
                     p.node_rank, p.nnodes)
            continue
        module = importlib.import_module(STAGES[name])
        # a stage may say its outputs are complete and match their inputs (trainer/data/fresh.py)
        done = None if force else getattr(module, "up_to_date", lambda _cfg: None)(cfg)
        if done:
            log.info("run %s: stage %s skipped: %s (--force redoes it)", cfg.name, name, done)
            continue
        log.info("run %s: stage %s", cfg.name, name)
        rc = module.stage(cfg)
        if rc:
            log.error("run %s: stage %s failed (exit %d)", cfg.name, name, rc)
            return rc
    return 0
