"""The held-out split: which conversations training never sees, and the shards each side is written to.

A conversation is held out when a hash of its prompt (its first user turn, Unicode NFKC with runs of
whitespace made one space; `split_key`) falls below `data.heldout_share`. So the choice is the same on
every machine and every re-prepare, the same prompt under two record ids (a regenerated copy, a second
sample of one question) lands on one side, and every row of a conversation (one per assistant turn)
lands on the same side: no prompt the drafter trained on reaches the held-out set.
The held-out rows get their own shards dir (`data.heldout_shards`) with its own manifest and doctor
report; `train` reads only `data.shards`, and `eval` scores the held-out shards by default.
"""
from __future__ import annotations

import hashlib
import time
import unicodedata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.data.config import DoctorConfig
from trainer.data.doctor import SAMPLE_COLUMNS, Verdict, degenerate_flags, diagnose
from trainer.data.shards import (
    FORMAT_VERSION,
    MANIFEST,
    ShardWriter,
    data_digest,
    length_histogram,
    write_json_atomic,
    write_samples,
)

if TYPE_CHECKING:
    from trainer.data.render import Row


SPLIT_BY = "first-user-turn"  # recorded with prepare's inputs: a change of the key re-prepares


def split_key(messages: list[dict[str, Any]], fallback: str) -> str:
    """What the split hashes for a conversation: its first user turn, normalized (NFKC, whitespace runs
    as one space, stripped); `fallback` (the record id) for a conversation without a user turn."""
    for m in messages:
        if m.get("role") == "user":
            text = " ".join(unicodedata.normalize("NFKC", str(m.get("content") or "")).split())
            return "user:" + text
    return "id:" + fallback


def is_heldout(key: str, share: float) -> bool:
    """Deterministic by key: the first 64 bits of sha256(key) as a fraction of 2**64, below `share`."""
    if share <= 0.0:
        return False
    return int(hashlib.sha256(key.encode()).hexdigest()[:16], 16) / 2**64 < share


class Sink:
    """One side of the split: its shard writer and the doctor's per-sample facts."""

    def __init__(self, out_dir: str | Path, rows_per_shard: int, doctor: DoctorConfig, drop_degenerate: bool,
                 split: str) -> None:
        self.dir = Path(out_dir)
        self.writer = ShardWriter(out_dir, rows_per_shard)
        self.cols: dict[str, list[Any]] = {c: [] for c in SAMPLE_COLUMNS}
        self.doctor = doctor
        self.drop_degenerate = drop_degenerate
        self.split = split
        self.tokens = 0
        self.verdict: Verdict | None = None

    def add(self, row: Row) -> None:
        facts = {c: getattr(row, c) for c in SAMPLE_COLUMNS if c != "kept" and c != "length"}
        facts["length"] = row.length
        bad = degenerate_flags({k: [v] for k, v in facts.items()}, self.doctor)[0]
        keep = not (self.drop_degenerate and bad)
        facts["kept"] = keep
        for c, v in facts.items():
            self.cols[c].append(v)
        if keep:
            self.writer.add(row.input_ids, row.loss_mask, row.id, row.turn)
            self.tokens += row.length

    def close(self, meta: dict[str, Any]) -> dict[str, Any]:
        """Finish the shards, judge them, write and return the manifest (`meta`: source, tokenizer ...)."""
        shards = self.writer.close()
        samples_file = write_samples(self.dir, self.cols)
        self.verdict = diagnose(self.cols, self.doctor)
        cols, kept = self.cols, self.cols["kept"]
        manifest = {
            "format": FORMAT_VERSION,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "split": self.split,
            **meta,
            "counts": {
                "records": len(set(cols["id"])),
                "samples": len(cols["id"]), "rows": len(self.writer.lengths),
                "dropped_degenerate": len(cols["id"]) - len(self.writer.lengths), "tokens": self.tokens,
                "supervised_tokens": sum(s for s, k in zip(cols["n_supervised"], kept, strict=True) if k),
            },
            "length_histogram": length_histogram(self.writer.lengths),
            "shards": shards,
            "samples": samples_file,
            "doctor": self.verdict.to_json(data_digest(shards), self.doctor),
        }
        write_json_atomic(self.dir / MANIFEST, manifest)
        return manifest
