"""Run-config section `eval:` (owned by trainer/eval/)."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, slots=True)
class EvalConfig:
    max_samples: int = 64
