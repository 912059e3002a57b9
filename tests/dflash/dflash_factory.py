"""Builders for the DFlash trainer tests: prepared shards with a doctor verdict, random token rows."""
from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path


def write_shards(directory: Path, rows: Sequence[tuple[list[int], list[int]]], *, doctor_passed: bool = True
                 ) -> Path:
    """Prepared shards as trainer/data writes them (ShardWriter + manifest), with a doctor verdict.

    The doctor itself is trainer/data's; here its verdict is recorded directly (bound to the shard
    digest exactly like prepare does) so the tests control pass/refuse.
    """
    from trainer.data.shards import FORMAT_VERSION, MANIFEST, ShardWriter, data_digest, write_json_atomic

    w = ShardWriter(directory)
    for i, (ids, mask) in enumerate(rows):
        w.add(ids, mask, f"s{i}", 0)
    shards = w.close()
    manifest = {
        "format": FORMAT_VERSION,
        "counts": {"rows": len(rows)},
        "shards": shards,
        "doctor": {"passed": doctor_passed, "data_digest": data_digest(shards),
                   "reasons": [] if doctor_passed else ["87% of samples have loss_mask sum 6"]},
    }
    write_json_atomic(directory / MANIFEST, manifest)
    return directory


def random_rows(n: int, length: int, vocab: int = 500, seed: int = 0, prompt: int = 0
                ) -> list[tuple[list[int], list[int]]]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        ln = length - (i % 3) * 4
        ids = [rng.randrange(vocab) for _ in range(ln)]
        rows.append((ids, [0] * prompt + [1] * (ln - prompt)))
    return rows


def descendants(pid: int) -> list[int]:
    """Every process under `pid`, from /proc (torchrun starts its ranks in their own sessions, so a signal
    to the launcher's process group does not reach them)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid:
            out += [int(d.name), *descendants(int(d.name))]
    return out
