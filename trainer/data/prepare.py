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
from trainer.data.doctor import Verdict
from trainer.data.records import DataError, input_files, iter_payloads, parse_payload
from trainer.data.render import Row, expand
from trainer.data.shards import MANIFEST, staging_dir, swap_in, write_json_atomic
from trainer.data.split import Sink, is_heldout

log = logging.getLogger(__name__)
CHUNK = 32  # records per task sent to a worker

_worker: dict[str, Any] = {}


@dataclasses.dataclass(frozen=True, slots=True)
class PrepareResult:
    manifest: dict[str, Any]
    verdict: Verdict  # on the training shards: what `train` is gated on
    seconds: float
    heldout: tuple[dict[str, Any], Verdict] | None = None  # the held-out shards' manifest and report


def clear_staging(final: Path) -> None:
    """Remove what an interrupted prepare left beside `final` (its hidden .new-PID / .old-PID dirs)."""
    import shutil

    for d in [*final.parent.glob(f".{final.name}.new-*"), *final.parent.glob(f".{final.name}.old-*")]:
        shutil.rmtree(d, ignore_errors=True)


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


def _chunks(files: list[Path], progress: Any, max_line_bytes: int | None,
            ) -> Iterator[list[tuple[str, Any]]]:
    chunk: list[tuple[str, Any]] = []
    done_before = 0
    for f in files:
        last = 0
        for where, payload, pos in iter_payloads(f, max_line_bytes):
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
          template_kwargs: dict[str, Any] | None, progress: Any, max_line_bytes: int | None = None,
          ) -> Iterator[Row]:
    chunks = _chunks(files, progress, max_line_bytes)
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
    show_progress: bool = True, heldout_share: float = 0.0, heldout_dir: str | Path | None = None,
    inputs: dict[str, Any] | None = None, max_line_bytes: int | None = None,
) -> PrepareResult:
    """Tokenise `completions` into shards under `out_dir` and run the doctor (verdict in the manifest).
    With `heldout_share` > 0, the conversations trainer/data/split.py holds out go to `heldout_dir`
    instead, with their own manifest and doctor report (`PrepareResult.heldout`). `inputs` (what the
    shards are made from, trainer/data/fresh.py) is recorded in the manifest. The shards are written
    beside the old ones and swapped in when complete: a failed or killed prepare leaves the old ones."""
    if heldout_share > 0 and heldout_dir is None:
        raise DataError("prepare: a held-out share needs a held-out shards dir (data.heldout_shards)")
    dirs = [Path(out_dir)] + ([Path(heldout_dir)] if heldout_share > 0 and heldout_dir else [])
    for d in dirs:
        clear_staging(d)
    try:
        result = _prepare(completions, staging_dir(out_dir), tokenizer_path, max_length=max_length,
                          num_workers=num_workers, rows_per_shard=rows_per_shard,
                          drop_degenerate=drop_degenerate, doctor=doctor,
                          chat_template_kwargs=chat_template_kwargs, show_progress=show_progress,
                          heldout_share=heldout_share, heldout_dir=heldout_dir, inputs=inputs or {},
                          max_line_bytes=max_line_bytes)
    except BaseException:
        for d in dirs:
            clear_staging(d)
        raise
    for d in dirs[::-1]:  # the held-out shards first: the training manifest names them
        swap_in(staging_dir(d), d)
    return result


def _prepare(
    completions: str | Path, staged: Path, tokenizer_path: str | Path, *, max_length: int,
    num_workers: int, rows_per_shard: int, drop_degenerate: bool, doctor: DoctorConfig | None,
    chat_template_kwargs: dict[str, Any] | None, show_progress: bool, heldout_share: float,
    heldout_dir: str | Path | None, inputs: dict[str, Any], max_line_bytes: int | None,
) -> PrepareResult:
    from tqdm import tqdm

    doctor = doctor or DoctorConfig()
    files = input_files(completions)
    tok = load_tokenizer(tokenizer_path)  # fails here, with a clear message, before any worker starts
    workers = num_workers or os.cpu_count() or 1
    total_bytes = sum(f.stat().st_size for f in files)
    t0 = time.perf_counter()
    train = Sink(staged, rows_per_shard, doctor, drop_degenerate, "training")
    held = (Sink(staging_dir(heldout_dir), rows_per_shard, doctor, drop_degenerate, "heldout")
            if heldout_share > 0 and heldout_dir is not None else None)
    n = n_train = 0
    with tqdm(total=total_bytes, unit="B", unit_scale=True, desc="prepare", disable=not show_progress,
              smoothing=0.1) as bar:
        for row in _rows(files, tok, str(tokenizer_path), max_length, workers, chat_template_kwargs, bar,
                         max_line_bytes):
            sink = held if held is not None and is_heldout(row.split_key, heldout_share) else train
            sink.add(row)
            n += 1
            n_train += sink is train
            if n % 256 == 0:
                bar.set_postfix(samples=n, rate=f"{n / (time.perf_counter() - t0):.0f}/s")
    if n == 0:
        raise DataError(f"prepare: no sample in {completions} ({len(files)} files, {total_bytes} bytes, no "
                        "conversation with an answer); nothing is written (is the generate output empty?)")
    if n_train == 0:
        raise DataError(f"prepare: no sample left for training: all {n} samples of {completions} fall in the "
                        f"held-out split (data.heldout_share {heldout_share}); nothing is written. Add "
                        "conversations or lower data.heldout_share")
    meta = {"source": {"completions": str(completions), "files": [str(f) for f in files],
                       "bytes": total_bytes},
            "tokenizer": str(tokenizer_path), "max_length": max_length, "inputs": inputs}
    held_manifest = held.close({**meta, "heldout_share": heldout_share}) if held is not None else None
    split = {"share": heldout_share, "dir": str(heldout_dir), "records": held_manifest["counts"]["records"],
             "rows": held_manifest["counts"]["rows"]} if held_manifest else {"share": 0.0}
    manifest = train.close({**meta, "heldout": split})
    seconds = time.perf_counter() - t0
    manifest["seconds"] = round(seconds, 2)
    write_json_atomic(staged / MANIFEST, manifest)
    log.info("prepare: %d samples -> %d rows in %d shards (%.1f samples/s, %d workers)",
             n, manifest["counts"]["rows"], len(manifest["shards"]), n / max(seconds, 1e-9), workers)
    assert train.verdict is not None
    heldout = (held_manifest, held.verdict) if held is not None and held_manifest else None
    return PrepareResult(manifest, train.verdict, seconds, heldout)
