"""Arrow shards of prepared rows, their manifest, and the doctor gate that `train` calls.

A shards directory holds:

    shard-00000.arrow ...   Arrow IPC files: input_ids (list<int32>), loss_mask (list<int8>), id, turn, length
    samples.arrow           one row of doctor facts per rendered sample (kept and dropped), see doctor.py
    manifest.json           counts, length histogram, sha256 + size of every file, and the doctor's verdict

`ShardDataset.open(dir)` memory-maps the shards. `check_doctor(dir)` raises `DataRefused` unless the
doctor passed this exact data (its verdict records a digest of the shard checksums).
"""
from __future__ import annotations

import bisect
import hashlib
import json
import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from trainer.layout import MANIFEST_FILE

MANIFEST = MANIFEST_FILE  # trainer.layout owns the name
SAMPLES = "samples.arrow"
FORMAT_VERSION = 1

log = logging.getLogger(__name__)


class DataRefused(RuntimeError):
    """The data must not be trained on (doctor refused or never ran); the message says why."""


def _pa() -> Any:
    import pyarrow

    return pyarrow


def shard_schema() -> Any:
    pa = _pa()
    return pa.schema([
        ("input_ids", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.int8())),
        ("id", pa.string()),
        ("turn", pa.int32()),
        ("length", pa.int32()),
    ])


def sha256_file(path: str | Path, bufsize: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(bufsize):
            h.update(chunk)
    return h.hexdigest()


def data_digest(files: Sequence[dict[str, Any]]) -> str:
    """One digest over the shard files' names and checksums: what the doctor's verdict is bound to."""
    h = hashlib.sha256()
    for f in sorted(files, key=lambda f: f["name"]):
        h.update(f"{f['name']}:{f['sha256']}\n".encode())
    return h.hexdigest()


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)


def read_manifest(directory: str | Path) -> dict[str, Any]:
    path = Path(directory) / MANIFEST
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError as e:
        raise DataRefused(f"{directory}: no {MANIFEST}: not a prepared shards directory "
                          f"(run `python -m trainer prepare RUN.yml`)") from e
    except (OSError, json.JSONDecodeError) as e:
        raise DataRefused(f"{path}: unreadable manifest ({e})") from e
    if not isinstance(data, dict) or data.get("format") != FORMAT_VERSION:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise DataRefused(f"{path}: unknown manifest format {found!r} (expected {FORMAT_VERSION})")
    return data


def staging_dir(final: str | Path) -> Path:
    """Where a new set of shards is written beside `final` before `swap_in` (a hidden sibling)."""
    final = Path(final)
    return final.with_name(f".{final.name}.new-{os.getpid()}")


def swap_in(staged: Path, final: Path) -> None:
    """Put the finished `staged` dir at `final`, then delete the old one. Readers of `final` see the old
    shards or the new ones, never a mix and never none: on Linux the two dirs are exchanged in one
    renameat2(RENAME_EXCHANGE); where that is refused (non-Linux, some filesystems) the old dir is
    renamed away and the new one renamed in, which leaves `final` missing for that instant only."""
    import shutil

    old = final.with_name(f".{final.name}.old-{os.getpid()}")
    if not final.exists():
        os.rename(staged, final)
        return
    if _exchange(staged, final):
        shutil.rmtree(staged)  # now holds the old shards
        return
    os.rename(final, old)
    os.rename(staged, final)
    shutil.rmtree(old)


def _exchange(a: Path, b: Path) -> bool:
    """renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE); False when the system refuses it."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    return fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


class ShardWriter:
    """Writes rows into numbered Arrow IPC shards of at most `rows_per_shard` rows."""

    def __init__(self, directory: str | Path, rows_per_shard: int = 8192) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        for stale in [*self.dir.glob("shard-*.arrow"), self.dir / MANIFEST, self.dir / SAMPLES]:
            stale.unlink(missing_ok=True)  # a re-prepare must not mix old and new shards
        self.rows_per_shard = rows_per_shard
        self.files: list[dict[str, Any]] = []
        self.lengths: list[int] = []
        self._buf: dict[str, list[Any]] = {k: [] for k in shard_schema().names}

    def add(self, input_ids: Sequence[int], loss_mask: Sequence[int], id: str, turn: int) -> None:
        b = self._buf
        b["input_ids"].append(input_ids)
        b["loss_mask"].append(loss_mask)
        b["id"].append(id)
        b["turn"].append(turn)
        b["length"].append(len(input_ids))
        self.lengths.append(len(input_ids))
        if len(b["id"]) >= self.rows_per_shard:
            self.flush()

    def flush(self) -> None:
        if not self._buf["id"]:
            return
        pa = _pa()
        table = pa.Table.from_pydict(self._buf, schema=shard_schema())
        name = f"shard-{len(self.files):05d}.arrow"
        path = self.dir / name
        tmp = path.with_name(f".{name}.tmp")
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=1024)
        os.replace(tmp, path)
        self.files.append({"name": name, "rows": table.num_rows, "bytes": path.stat().st_size,
                           "sha256": sha256_file(path)})
        self._buf = {k: [] for k in self._buf}

    def close(self) -> list[dict[str, Any]]:
        self.flush()
        return self.files


def write_samples(directory: str | Path, columns: dict[str, list[Any]]) -> dict[str, Any]:
    """Write the doctor's per-sample table; returns its file entry (name, rows, bytes, sha256)."""
    pa = _pa()
    table = pa.Table.from_pydict(columns)
    path = Path(directory) / SAMPLES
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return {"name": SAMPLES, "rows": table.num_rows, "bytes": path.stat().st_size,
            "sha256": sha256_file(path)}


def read_samples(directory: str | Path) -> dict[str, list[Any]]:
    pa = _pa()
    path = Path(directory) / SAMPLES
    if not path.exists():
        raise DataRefused(f"{directory}: no {SAMPLES} (the doctor's per-sample table); re-run prepare")
    with pa.memory_map(str(path), "r") as src:
        return pa.ipc.open_file(src).read_all().to_pydict()


def length_histogram(lengths: Iterable[int], bins: Sequence[int] = (
        64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)) -> dict[str, int]:
    """Counts per length range, keyed "<=64", "<=128", ..., ">32768"."""
    counts = [0] * (len(bins) + 1)
    for n in lengths:
        counts[bisect.bisect_left(bins, n)] += 1
    keys = [f"<={b}" for b in bins] + [f">{bins[-1]}"]
    return {k: c for k, c in zip(keys, counts, strict=True) if c}


class ShardDataset:
    """Random access over prepared shards: `ds[i] -> {"input_ids", "loss_mask", "id", "turn"}`."""

    def __init__(self, directory: Path, manifest: dict[str, Any], tables: list[Any]) -> None:
        self.dir = directory
        self.manifest = manifest
        self._tables = tables
        self._starts: list[int] = []
        total = 0
        for t in tables:
            self._starts.append(total)
            total += t.num_rows
        self._len = total
        self.lengths: list[int] = [n for t in tables for n in t.column("length").to_pylist()]

    @classmethod
    def open(cls, directory: str | Path, verify: bool = False) -> ShardDataset:
        """Open `directory` (memory-mapped). `verify=True` re-hashes every shard against the manifest."""
        pa = _pa()
        d = Path(directory)
        manifest = read_manifest(d)
        tables = []
        for f in manifest["shards"]:
            path = d / f["name"]
            if not path.exists():
                raise DataRefused(f"{path}: listed in {MANIFEST} but missing")
            if path.stat().st_size != f["bytes"]:
                raise DataRefused(f"{path}: size {path.stat().st_size} != {f['bytes']} in {MANIFEST}")
            if verify and sha256_file(path) != f["sha256"]:
                raise DataRefused(f"{path}: sha256 mismatch with {MANIFEST} (corrupt shard)")
            source = pa.memory_map(str(path), "r")
            tables.append(pa.ipc.open_file(source).read_all())
        ds = cls(d, manifest, tables)
        if len(ds) != manifest["counts"]["rows"]:
            want = manifest["counts"]["rows"]
            raise DataRefused(f"{d}: shards hold {len(ds)} rows, {MANIFEST} says {want}")
        return ds

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, i: int) -> dict[str, Any]:
        if i < 0:
            i += self._len
        if not 0 <= i < self._len:
            raise IndexError(f"row {i} out of range (dataset has {self._len} rows)")
        s = bisect.bisect_right(self._starts, i) - 1
        t, j = self._tables[s], i - self._starts[s]
        return {
            "input_ids": t.column("input_ids")[j].as_py(),
            "loss_mask": t.column("loss_mask")[j].as_py(),
            "id": t.column("id")[j].as_py(),
            "turn": t.column("turn")[j].as_py(),
        }


def check_doctor(directory: str | Path, allow_unchecked: bool = False) -> dict[str, Any]:
    """Raise `DataRefused` unless the doctor passed the data in `directory`; returns its verdict.

    `allow_unchecked=True` (the explicit override, e.g. `train.allow_unchecked_data`) logs a warning
    instead of refusing when the doctor refused or never ran; a missing/corrupt manifest still refuses.
    """
    manifest = read_manifest(directory)
    doctor = manifest.get("doctor") or {}
    hint = (f"see `python -m trainer doctor {directory}` for the report; "
            f"train anyway only with an explicit override (allow_unchecked_data)")
    if not doctor:
        reason = "the doctor has not checked this data"
    elif doctor.get("data_digest") != data_digest(manifest["shards"]):
        reason = "the doctor's verdict is for other data (shards changed since it ran)"
    elif not doctor.get("passed"):
        why = "; ".join(doctor.get("reasons") or ["no reason recorded"])
        reason = f"the doctor refused this data: {why}"
    else:
        return doctor
    if allow_unchecked:
        log.warning("%s: %s — training anyway (allow_unchecked_data is set)", directory, reason)
        return doctor
    raise DataRefused(f"{directory}: {reason}; {hint}")
