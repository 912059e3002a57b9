"""Run-config section `data:` (owned by trainer/data/)."""
from __future__ import annotations

import dataclasses

from trainer.ranges import check_ranges


@dataclasses.dataclass(frozen=True, slots=True)
class DoctorConfig:
    """Thresholds of the dataset doctor. A dataset is refused when a check's share exceeds its limit."""

    min_supervised_tokens: int = 8  # a sample with fewer supervised tokens is degenerate
    max_degenerate_share: float = 0.05  # empty response / too few supervised tokens / no 2-token run
    max_duplicate_share: float = 0.2  # identical responses (beyond the first of each)
    max_truncated_share: float = 0.2  # rows cut at data.max_length
    max_unterminated_share: float = 0.5  # <think> opened and never closed (generator hit its limit)
    max_mode_share: float = 0.5  # share of samples with one identical supervised-token count
    mode_min_tokens: int = 64  # ...counted only when that count is below this (e.g. every sample "exactly 6")

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name.startswith("max_") and not 0.0 <= v <= 1.0:
                raise ValueError(f"data.doctor.{f.name} must be a share in [0, 1], got {v}")
        if self.min_supervised_tokens < 2:
            raise ValueError("data.doctor.min_supervised_tokens must be >= 2 (an anchor needs 2 tokens), "
                             f"got {self.min_supervised_tokens}")
        check_ranges(self, "data.doctor", {"mode_min_tokens": ">= 0"})


@dataclasses.dataclass(frozen=True, slots=True)
class DataConfig:
    completions: str = ""  # input completions (jsonl dir/file or s3://...); "" = the generate output
    shards: str = "shards"  # prepared Arrow shards, relative to the run dir
    # share of conversation ids held out of training (by a hash of the id: deterministic), written to
    # `heldout_shards` (relative to the run dir); eval scores them by default. 0 = no held-out split.
    heldout_share: float = 0.01
    heldout_shards: str = "shards-heldout"
    max_length: int = 4096
    # a completions line longer than this is refused (file:line) before it is parsed or tokenised; one
    # conversation of max_length tokens is far below it, so a longer line is a damaged or foreign file.
    # generate rejects a prompts line longer than this (file:line, in its rejects) without reading it
    max_line_bytes: int = 64 * 1024 * 1024
    tokenizer: str = ""  # tokenizer dir; "" = target.path
    num_workers: int = 0  # tokenising processes; 0 = all cores
    rows_per_shard: int = 8192
    drop_degenerate: bool = True  # drop degenerate rows from the shards (they stay in the doctor's counts)
    upload_shards: bool = False  # upload the shards to s3://<bucket>/<prefix>/<shards> after prepare
    doctor: DoctorConfig = dataclasses.field(default_factory=DoctorConfig)

    def __post_init__(self) -> None:
        if self.max_length < 16:
            raise ValueError(f"data.max_length must be >= 16, got {self.max_length}")
        if self.max_line_bytes < 1024:
            raise ValueError(f"data.max_line_bytes must be >= 1024, got {self.max_line_bytes}")
        if self.num_workers < 0:
            raise ValueError(f"data.num_workers must be >= 0, got {self.num_workers}")
        if self.rows_per_shard < 1:
            raise ValueError(f"data.rows_per_shard must be >= 1, got {self.rows_per_shard}")
        if not 0.0 <= self.heldout_share <= 0.5:
            raise ValueError(f"data.heldout_share must be within [0, 0.5], got {self.heldout_share}")
        if self.heldout_share and self.heldout_shards.strip("/") in ("", self.shards.strip("/")):
            raise ValueError(f"data.heldout_shards must be a dir of its own, not {self.heldout_shards!r} "
                             f"(data.shards is {self.shards!r})")
