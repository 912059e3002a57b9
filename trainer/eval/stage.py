"""The `eval` stage: offline acceptance length (tau) of a checkpoint, written to
`RunLayout.eval_result(step)`. torch is imported inside the stage.
"""
from __future__ import annotations

import logging

from trainer.config import RunConfig

log = logging.getLogger(__name__)


def stage(cfg: RunConfig, checkpoint: str | None = None) -> int:
    """Evaluate `checkpoint` (default: the run's latest)."""
    from trainer.data.shards import DataRefused
    from trainer.eval.acceptance import evaluate, format_result, write_result

    try:
        res = evaluate(cfg, checkpoint)
    except (FileNotFoundError, DataRefused) as e:
        log.error("eval: %s", e)
        return 2
    print(format_result(res))
    log.info("eval result written to %s", write_result(cfg, res))
    return 0
