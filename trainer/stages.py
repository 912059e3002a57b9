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


def run_stages(cfg: RunConfig, force: bool = False) -> int:
    """Run the stages of `cfg` in order; the exit code of the first that fails, else 0."""
    for name in cfg.stages:
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
