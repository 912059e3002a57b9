"""Run-config section `eval:` (owned by trainer/eval/)."""
from __future__ import annotations

import dataclasses

from trainer.ranges import check_ranges


@dataclasses.dataclass(frozen=True, slots=True)
class EvalConfig:
    max_samples: int = 64  # rows of the eval shards to score, drawn with `seed` (a seeded permutation)
    shards: str = ""  # "" = the run's data.shards (relative to the run dir, or absolute)
    max_anchors: int = 64  # blocks per sample
    seed: int = 1234  # rows and anchors drawn (fixed, so two checkpoints are scored on the same blocks)

    def __post_init__(self) -> None:
        if self.max_samples < 1:
            raise ValueError(f"eval.max_samples must be >= 1, got {self.max_samples}")
        if self.max_anchors < 1:
            raise ValueError(f"eval.max_anchors must be >= 1, got {self.max_anchors}")
        check_ranges(self, "eval", {"seed": ">= 0"})
