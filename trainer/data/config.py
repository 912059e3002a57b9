"""Run-config section `data:` (owned by trainer/data/)."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, slots=True)
class DataConfig:
    completions: str = ""  # input completions (jsonl dir/file or s3://...); "" = the generate output
    shards: str = "shards"  # prepared Arrow shards, relative to the run dir
    max_length: int = 4096
