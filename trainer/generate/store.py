"""The local spool of finished completions: the source of truth for exactly-once.

Layout under the output dir (only finished shards sit at the top level, for prepare to read; the names
are trainer.layout's):

    part-00000-1a2b3c.jsonl.zst       sealed shards, one record per line
    manifest.json                     shard list + checksums + counts (also on S3)
    _state/open/part-00001-1a2b3c.jsonl    the shard being written, one flushed line per completion
    _state/manifest/part-00000-1a2b3c.json sidecar per sealed shard: sha256, bytes, records, ids
    _state/uploaded                   names of the shards already on S3, one per line
    _state/rejects.ndjson             rejected prompts with the reason (rewritten each run)
    _state/progress.json              done/total, rates, ETA (trainer/generate/progress.py, each tick)

A completion counts as done once its line is in a shard file. Each line is written with one write()
and flushed, so a kill -9 loses at most the line being written (a torn last line is dropped on
recovery). Sealing writes the final shard through a temp file + rename, then its sidecar, then
removes the open file; `recover()` finishes whichever step a crash interrupted, and drops any id it
has already seen, so no id is ever kept twice.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import secrets
from pathlib import Path
from typing import Any

from trainer.layout import OPEN_DIR, SIDECARS_DIR, generate_state_dir, manifest_of
from trainer.safepath import UnsafePathError, check_name

SHARD_RE = re.compile(r"^part-(\d{5,})-([0-9a-f]+)\.(jsonl|jsonl\.zst)$")


class StoreLocked(RuntimeError):
    """Another process holds the output dir."""


class SidecarError(ValueError):
    """A sidecar that cannot be used (e.g. a shard name that is not one plain file name); the message
    names the sidecar and what is wrong with it."""


@dataclasses.dataclass(frozen=True, slots=True)
class ShardInfo:
    name: str  # file name of the sealed shard
    sha256: str
    bytes: int
    records: int
    ids: tuple[str, ...]

    def to_json(self, with_ids: bool = True) -> dict[str, Any]:
        d = {"shard": self.name, "sha256": self.sha256, "bytes": self.bytes, "records": self.records}
        if with_ids:
            d["ids"] = list(self.ids)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any], where: str = "sidecar") -> ShardInfo:
        """A sidecar's JSON; its shard name becomes a local path and an S3 key, so it must be one plain
        file name (SidecarError naming `where` and the name otherwise)."""
        try:
            name = check_name(d["shard"])
        except UnsafePathError as e:
            raise SidecarError(f"{where}: unsafe shard name {e.name!r} ({e.reason})") from None
        return cls(name, d["sha256"], int(d["bytes"]), int(d["records"]), tuple(d["ids"]))


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def read_records(data: bytes, name: str) -> list[dict[str, Any]]:
    """Records of a shard's bytes (zstd or plain jsonl)."""
    if name.endswith(".zst"):
        import zstandard

        data = zstandard.ZstdDecompressor().decompressobj().decompress(data)
    return [json.loads(line) for line in data.splitlines() if line.strip()]


class ShardStore:
    def __init__(self, out: Path, fmt: str = "jsonl.zst", shard_records: int = 2000) -> None:
        self.out = out
        self.fmt = fmt
        self.shard_records = shard_records
        self.state = generate_state_dir(out)
        self.open_dir = out / OPEN_DIR
        self.side_dir = out / SIDECARS_DIR
        for d in (self.out, self.open_dir, self.side_dir):
            d.mkdir(parents=True, exist_ok=True)
        self._lock = self._take_lock()
        self.session = secrets.token_hex(3)
        self.shards: dict[str, ShardInfo] = {}
        self.done: set[str] = set()
        self.next_seq = 0
        self._fh: Any = None
        self._open_path: Path | None = None
        self._open_ids: list[str] = []

    def _take_lock(self) -> Any:
        """One writer per output dir (the kernel drops the lock when the process dies, even by kill -9)."""
        import fcntl

        fh = (self.state / "lock").open("a+")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "?"
            fh.close()
            raise StoreLocked(f"{self.out}: another generate run (pid {holder}) is writing here") from None
        fh.seek(0)
        fh.truncate()
        fh.write(str(os.getpid()))
        fh.flush()
        return fh

    def close(self) -> None:
        """Release the output dir (the open shard, if any, stays for the next run to recover)."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    # ---------------------------------------------------------------- recovery
    def recover(self) -> list[str]:
        """Finish interrupted seals, rebuild the done set; returns notes on what was repaired."""
        notes: list[str] = []
        for tmp in list(self.out.glob("*.tmp")) + list(self.side_dir.glob("*.tmp")):
            tmp.unlink()
        for path in sorted(self.out.iterdir()):
            m = SHARD_RE.match(path.name)
            if not m:
                continue
            side = self.side_dir / (path.name.split(".")[0] + ".json")
            if side.exists():
                info = ShardInfo.from_json(json.loads(side.read_text()), str(side))
                if info.bytes != path.stat().st_size:
                    raise RuntimeError(f"{path}: size {path.stat().st_size} != {info.bytes} in {side}")
            else:
                info = self._sidecar_for(path)
                notes.append(f"rebuilt the sidecar of {path.name}")
            self._add(info)
        for path in sorted(self.open_dir.glob("part-*.jsonl")):
            stem = path.name[: -len(".jsonl")]
            if any(n.split(".")[0] == stem for n in self.shards):
                path.unlink()  # sealed before the crash; only the cleanup was missing
                continue
            kept, dropped = self._reopen(path)
            notes.append(f"recovered {kept} completions from {path.name}"
                         + (f" (dropped {dropped} torn/duplicate lines)" if dropped else ""))
            self._bump_seq(stem)
            if kept:
                info = self._seal_files(path)
                self.shards[info.name] = info  # its ids are in self.done already (_reopen)
            else:
                path.unlink()
        return notes

    def _reopen(self, path: Path) -> tuple[int, int]:
        """Rewrite an orphaned open shard keeping only whole, new records; returns (kept, dropped)."""
        good: list[bytes] = []
        dropped = 0
        for line in path.read_bytes().split(b"\n"):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                rid = str(rec["id"])
            except (ValueError, KeyError, TypeError):
                dropped += 1
                continue
            if rid in self.done:
                dropped += 1
                continue
            self.done.add(rid)
            good.append(line + b"\n")
        _atomic_write(path, b"".join(good))
        return len(good), dropped

    def _sidecar_for(self, path: Path) -> ShardInfo:
        data = path.read_bytes()
        ids = tuple(str(r["id"]) for r in read_records(data, path.name))
        info = ShardInfo(path.name, hashlib.sha256(data).hexdigest(), len(data), len(ids), ids)
        self._write_sidecar(info)
        return info

    def _write_sidecar(self, info: ShardInfo) -> None:
        path = self.side_dir / (info.name.split(".")[0] + ".json")
        _atomic_write(path, json.dumps(info.to_json()).encode())

    def _bump_seq(self, name: str) -> None:
        m = re.match(r"part-(\d+)-", name)
        if m:
            self.next_seq = max(self.next_seq, int(m.group(1)) + 1)

    def _add(self, info: ShardInfo) -> None:
        dup = self.done.intersection(info.ids)
        if dup:
            raise RuntimeError(f"{info.name}: ids already in another shard: {sorted(dup)[:5]}")
        self.shards[info.name] = info
        self.done.update(info.ids)
        self._bump_seq(info.name)

    def adopt(self, info: ShardInfo) -> None:
        """Register a shard that exists on S3 (and has been put in place locally by the caller)."""
        self._write_sidecar(info)
        self._add(info)

    # ---------------------------------------------------------------- writing
    def write(self, record: dict[str, Any]) -> Path | None:
        """Append one completion; returns the open shard's path when it is full (seal it next)."""
        rid = str(record["id"])
        if rid in self.done:
            raise RuntimeError(f"completion for id {rid!r} written twice (bug)")
        if self._fh is None:
            self._open_path = self.open_dir / f"part-{self.next_seq:05d}-{self.session}.jsonl"
            self.next_seq += 1
            self._fh = self._open_path.open("ab", buffering=0)
            self._open_ids = []
        self._fh.write(json.dumps(record, ensure_ascii=False).encode() + b"\n")
        self.done.add(rid)
        self._open_ids.append(rid)
        if len(self._open_ids) >= self.shard_records:
            return self.rotate()
        return None

    def rotate(self) -> Path | None:
        """Close the open shard (if any) and return its path for `seal`."""
        if self._fh is None:
            return None
        self._fh.close()
        path, self._fh, self._open_path = self._open_path, None, None
        return path

    def register(self, info: ShardInfo) -> None:
        """Record a shard sealed by `seal` (its ids are already in `done`); call from the event loop."""
        self.shards[info.name] = info

    def seal(self, open_path: Path) -> ShardInfo:
        """Turn a closed open shard into a sealed shard + sidecar; safe in a worker thread."""
        return self._seal_files(open_path)

    def _seal_files(self, open_path: Path) -> ShardInfo:
        raw = open_path.read_bytes()
        ids = tuple(str(json.loads(line)["id"]) for line in raw.splitlines() if line.strip())
        name = open_path.name if self.fmt == "jsonl" else open_path.name + ".zst"
        if self.fmt == "jsonl.zst":
            import zstandard

            raw = zstandard.ZstdCompressor(level=3).compress(raw)
        _atomic_write(self.out / name, raw)
        info = ShardInfo(name, hashlib.sha256(raw).hexdigest(), len(raw), len(ids), ids)
        self._write_sidecar(info)
        open_path.unlink()
        return info

    # ---------------------------------------------------------------- manifest
    def uploaded(self) -> set[str]:
        path = self.state / "uploaded"
        return set(path.read_text().split()) if path.exists() else set()

    def mark_uploaded(self, name: str) -> None:
        with (self.state / "uploaded").open("a") as fh:
            fh.write(name + "\n")

    def manifest(self, **extra: Any) -> dict[str, Any]:
        shards = [self.shards[n].to_json(with_ids=False) for n in sorted(self.shards)]
        return {"format": self.fmt, "records": sum(s["records"] for s in shards), "shards": shards,
                "ids_in": f"{SIDECARS_DIR}/<shard>.json", **extra}

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        _atomic_write(manifest_of(self.out), json.dumps(manifest, indent=1).encode())
