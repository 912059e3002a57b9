"""Is a prepare already done? What the shards were made from, and whether that still holds.

prepare records `inputs` in the manifest of its training shards: a digest of the completion files
(names and contents), of the tokenizer's files, and every setting that changes the rows (max_length,
rows_per_shard, drop_degenerate, the held-out split, the doctor's thresholds). `python -m trainer run`
skips prepare when the shards on disk are complete (every file at its recorded size), were made from
exactly these inputs, and the doctor passed them; `--force` redoes it.
"""
from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Any

from trainer.data.shards import MANIFEST, DataRefused, check_doctor, read_manifest, sha256_file
from trainer.data.split import SPLIT_BY

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                   "special_tokens_map.json")


def digest_files(files: list[Path], root: Path) -> str:
    """One sha256 over the files' paths (relative to `root`) and contents."""
    h = hashlib.sha256()
    for f in files:
        rel = f.relative_to(root) if root in f.parents else Path(f.name)
        h.update(f"{rel}:{sha256_file(f)}\n".encode())
    return h.hexdigest()


def inputs(completions: str | Path, tokenizer: str | Path, data: Any, heldout_dir: Path) -> dict[str, Any]:
    """What a prepare of `completions` with run-config section `data` is made from."""
    from trainer.data.records import input_files

    src = Path(completions)
    tok = Path(tokenizer)
    tok_files = [tok / n for n in TOKENIZER_FILES if (tok / n).is_file()]
    return {
        "completions": digest_files(input_files(src), src if src.is_dir() else src.parent),
        "tokenizer": digest_files(tok_files, tok),
        "max_length": data.max_length, "rows_per_shard": data.rows_per_shard,
        "drop_degenerate": data.drop_degenerate, "heldout_share": data.heldout_share,
        "heldout_shards": str(heldout_dir) if data.heldout_share > 0 else "",
        "heldout_split_by": SPLIT_BY if data.heldout_share > 0 else "",
        "doctor": dataclasses.asdict(data.doctor),
    }


def complete(directory: Path) -> dict[str, Any]:
    """The manifest of a shards dir whose files are all there at their recorded sizes; DataRefused if
    not."""
    manifest = read_manifest(directory)
    for f in [*manifest["shards"], manifest.get("samples") or {}]:
        if not f:
            continue
        path = directory / f["name"]
        if not path.is_file() or path.stat().st_size != f["bytes"]:
            raise DataRefused(f"{path}: missing or not the size {MANIFEST} records")
    return manifest


def done_reason(shards: Path, heldout: Path, want: dict[str, Any]) -> str | None:
    """Why prepare need not run again ("shards ... match"), or None when it must."""
    try:
        manifest = complete(shards)
        if manifest.get("inputs") != want:
            return None
        check_doctor(shards)
        if want["heldout_share"] > 0:
            complete(heldout)
    except DataRefused:
        return None
    counts = manifest["counts"]
    return (f"the shards at {shards} ({counts['rows']} rows, passed by the doctor) were made from these "
            f"completions (digest {want['completions'][:12]}), this tokenizer and these data settings")
