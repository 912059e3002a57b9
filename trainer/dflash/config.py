"""Run-config sections `drafter:`, `loss:`, `train:` (owned by trainer/dflash/)."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, slots=True)
class DrafterConfig:
    num_layers: int = 5
    block_size: int = 16


@dataclasses.dataclass(frozen=True, slots=True)
class LossConfig:
    kind: str = "ce"


@dataclasses.dataclass(frozen=True, slots=True)
class TrainConfig:
    lr: float = 6e-4
    epochs: int = 6
