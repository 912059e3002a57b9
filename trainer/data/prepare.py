"""`prepare`: completions -> rendered, tokenised, masked rows -> Arrow shards + manifest + doctor verdict.

The main process reads raw lines; worker processes (one per core by default) parse, render with the
target tokenizer's chat template and tokenise them in chunks; results come back in input order, so the
shards are identical for any number of workers. Every rendered row is recorded for the doctor;
degenerate rows are left out of the shards (`drop_degenerate`) but still count in its verdict.
"""
from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import os
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainer.data.config import DoctorConfig
from trainer.data.doctor import SAMPLE_COLUMNS, Verdict, degenerate_flags, diagnose
from trainer.data.records import DataError, input_files, iter_payloads, parse_payload
from trainer.data.render import Row, expand
from trainer.data.shards import (
    FORMAT_VERSION,
    MANIFEST,
    ShardWriter,
    data_digest,
    length_histogram,
    write_json_atomic,
    write_samples,
)

log = logging.getLogger(__name__)
CHUNK = 32  # records per task sent to a worker

_worker: dict[str, Any] = {}


@dataclasses.dataclass(frozen=True, slots=True)
class PrepareResult:
    manifest: dict[str, Any]
    verdict: Verdict
    seconds: float


def load_tokenizer(path: str | Path) -> Any:
    from transformers import AutoTokenizer

    p = Path(path)
    if not p.exists():
        raise DataError(f"tokenizer {p}: no such directory (data.tokenizer or target.path)")
    try:
        tok = AutoTokenizer.from_pretrained(str(p))
    except Exception as e:
        raise DataError(f"tokenizer {p}: cannot load ({e})") from e
    if not getattr(tok, "is_fast", False):
        raise DataError(f"tokenizer {p}: a fast tokenizer (tokenizer.json) is needed for offset mapping")
    if not getattr(tok, "chat_template", None):
        raise DataError(f"tokenizer {p}: it has no chat template")
    return tok


def _init_worker(tokenizer_path: str, max_length: int, template_kwargs: dict[str, Any] | None) -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    _worker.update(max_length=max_length, kwargs=template_kwargs)
    try:
        _worker["tok"] = load_tokenizer(tokenizer_path)
    except Exception as e:  # raised from _work instead: a failing initializer makes Pool respawn forever
        _worker["error"] = e


def _work(chunk: list[tuple[str, Any]]) -> list[Row]:
    if "error" in _worker:
        raise _worker["error"]
    rows: list[Row] = []
    for where, payload in chunk:
        conv = parse_payload(where, payload)
        rows.extend(expand(conv, _worker["tok"], _worker["max_length"], _worker["kwargs"]))
    return rows


def _chunks(files: list[Path], progress: Any) -> Iterator[list[tuple[str, Any]]]:
    chunk: list[tuple[str, Any]] = []
    done_before = 0
    for f in files:
        last = 0
        for where, payload, pos in iter_payloads(f):
            chunk.append((where, payload))
            if progress is not None and pos > last:
                progress.update(pos - last)
                last = pos
            if len(chunk) >= CHUNK:
                yield chunk
                chunk = []
        done_before += f.stat().st_size
        if progress is not None:
            progress.n = done_before
            progress.refresh()
    if chunk:
        yield chunk


def _inherit(tok: Any, max_length: int, template_kwargs: dict[str, Any] | None) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per worker; fork-safe


def _rows(files: list[Path], tok: Any, tokenizer_path: str, max_length: int, workers: int,
          template_kwargs: dict[str, Any] | None, progress: Any) -> Iterator[Row]:
    chunks = _chunks(files, progress)
    _worker.clear()
    _worker.update(tok=tok, max_length=max_length, kwargs=template_kwargs)
    if workers <= 1:
        for chunk in chunks:
            yield from _work(chunk)
        return
    if "fork" in multiprocessing.get_all_start_methods():
        # forked workers inherit the loaded tokenizer: no per-worker import of transformers (seconds
        # each, tens of seconds on a busy machine); the parent has not used tokenizer threads yet
        ctx = multiprocessing.get_context("fork")
        init, initargs = _inherit, (None, max_length, template_kwargs)
    else:
        ctx = multiprocessing.get_context("spawn")
        init, initargs = _init_worker, (tokenizer_path, max_length, template_kwargs)
    with ctx.Pool(workers, init, initargs) as pool:
        # a bounded window of chunks in flight (Pool.imap would read the whole input into memory)
        pending: deque[Any] = deque()
        for chunk in chunks:
            pending.append(pool.apply_async(_work, (chunk,)))
            if len(pending) >= 4 * workers:
                yield from pending.popleft().get()
        while pending:
            yield from pending.popleft().get()


def prepare(
    completions: str | Path, out_dir: str | Path, tokenizer_path: str | Path, *, max_length: int = 4096,
    num_workers: int = 0, rows_per_shard: int = 8192, drop_degenerate: bool = True,
    doctor: DoctorConfig | None = None, chat_template_kwargs: dict[str, Any] | None = None,
    show_progress: bool = True,
) -> PrepareResult:
    """Tokenise `completions` into shards under `out_dir` and run the doctor (verdict in the manifest)."""
    from tqdm import tqdm

    doctor = doctor or DoctorConfig()
    files = input_files(completions)
    tok = load_tokenizer(tokenizer_path)  # fails here, with a clear message, before any worker starts
    workers = num_workers or os.cpu_count() or 1
    total_bytes = sum(f.stat().st_size for f in files)
    t0 = time.perf_counter()
    writer = ShardWriter(out_dir, rows_per_shard)
    cols: dict[str, list[Any]] = {c: [] for c in SAMPLE_COLUMNS}
    n_tokens = 0
    with tqdm(total=total_bytes, unit="B", unit_scale=True, desc="prepare", disable=not show_progress,
              smoothing=0.1) as bar:
        for row in _rows(files, tok, str(tokenizer_path), max_length, workers, chat_template_kwargs, bar):
            facts = {c: getattr(row, c) for c in SAMPLE_COLUMNS if c != "kept" and c != "length"}
            facts["length"] = row.length
            one = {k: [v] for k, v in facts.items()}
            bad = degenerate_flags(one, doctor)[0]
            keep = not (drop_degenerate and bad)
            facts["kept"] = keep
            for c, v in facts.items():
                cols[c].append(v)
            if keep:
                writer.add(row.input_ids, row.loss_mask, row.id, row.turn)
                n_tokens += row.length
            n = len(cols["id"])
            if n % 256 == 0:
                bar.set_postfix(samples=n, rate=f"{n / (time.perf_counter() - t0):.0f}/s")
    shards = writer.close()
    samples_file = write_samples(out_dir, cols)
    verdict = diagnose(cols, doctor)
    seconds = time.perf_counter() - t0
    manifest = {
        "format": FORMAT_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "source": {"completions": str(completions), "files": [str(f) for f in files], "bytes": total_bytes},
        "tokenizer": str(tokenizer_path),
        "max_length": max_length,
        "counts": {
            "records": len(set(cols["id"])),
            "samples": len(cols["id"]), "rows": len(writer.lengths),
            "dropped_degenerate": len(cols["id"]) - len(writer.lengths), "tokens": n_tokens,
            "supervised_tokens": sum(s for s, k in zip(cols["n_supervised"], cols["kept"], strict=True) if k),
        },
        "length_histogram": length_histogram(writer.lengths),
        "shards": shards,
        "samples": samples_file,
        "doctor": verdict.to_json(data_digest(shards), doctor),
        "seconds": round(seconds, 2),
    }
    write_json_atomic(Path(out_dir) / MANIFEST, manifest)
    log.info("prepare: %d samples -> %d rows in %d shards (%.1f samples/s, %d workers)",
             len(cols["id"]), len(writer.lengths), len(shards), len(cols["id"]) / max(seconds, 1e-9), workers)
    return PrepareResult(manifest, verdict, seconds)
