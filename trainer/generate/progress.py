"""Live progress of a generation run (completions/s, output tok/s, per-endpoint load, ETA) and its summary."""
from __future__ import annotations

import collections
import dataclasses
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from trainer.generate.endpoints import Endpoint

log = logging.getLogger("trainer.generate")


def fmt_duration(seconds: float) -> str:
    if seconds != seconds or seconds == float("inf"):  # NaN / inf
        return "?"
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


@dataclasses.dataclass(slots=True)
class Counters:
    total: int = 0  # prompts to do in this run (after skipping the done ones), estimated from line counts
    skipped_done: int = 0
    completed: int = 0  # conversations written
    turns: int = 0  # answers kept (a conversation with k user turns has up to k)
    tokens_out: int = 0
    rejected: int = 0
    rejected_by_endpoint: int = 0
    flagged: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    retried_flagged: int = 0
    requeued: int = 0
    server_errors: int = 0
    aborted: int = 0  # answers with finish_reason "abort" (re-queued, never written)
    transport_errors: int = 0  # failed requests whose endpoint still answered /health (re-queued)
    skipped_budget: int = 0  # conversations whose first turn left less than generate.budget_min_tokens


class Progress:
    """Counters + a tqdm bar (when stderr is a terminal) + a log line every `interval_s`, and, with `path`
    (RunLayout.generate_progress), the same figures as JSON rewritten at each tick for
    `python -m trainer status`."""

    def __init__(self, endpoints: list[Endpoint], interval_s: float, path: Path | None = None) -> None:
        self.endpoints = endpoints
        self.interval_s = interval_s
        self.path = path
        self.already_done = 0  # completions found in the spool (or on S3) when this run started
        self.c = Counters()
        self.t0 = time.monotonic()
        self.window: collections.deque[tuple[float, int, int]] = collections.deque(maxlen=13)
        self.bar: Any = None

    def start(self, total: int, already_done: int = 0) -> None:
        self.c.total = total
        self.already_done = already_done
        self.t0 = time.monotonic()
        self.window.append((self.t0, 0, 0))
        if sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="compl", dynamic_ncols=True, smoothing=0.05)
        self.write()

    def answered(self, tokens: int) -> None:
        self.c.turns += 1
        self.c.tokens_out += tokens

    def completed(self) -> None:
        self.c.completed += 1
        if self.bar is not None:
            self.bar.update(1)

    def rates(self) -> tuple[float, float]:
        """(completions/s, output tokens/s) over the last minute or so."""
        now = time.monotonic()
        t, n, tok = self.window[0] if self.window else (self.t0, 0, 0)
        dt = max(now - t, 1e-9)
        return (self.c.completed - n) / dt, (self.c.tokens_out - tok) / dt

    def left(self) -> int:
        """Prompts of this run still to answer (a rejected prompt is never answered)."""
        return max(self.c.total - self.c.completed - self.c.rejected - self.c.skipped_budget, 0)

    def line(self) -> str:
        cps, tps = self.rates()
        left = self.left()
        eta = left / cps if cps > 0 else float("inf")
        loads = " | ".join(e.describe() for e in self.endpoints)
        return (f"{self.c.completed}/{self.c.total} done, {cps:.1f} compl/s, {tps:.0f} out tok/s, "
                f"ETA {fmt_duration(eta)} | {loads}")

    def tick(self) -> None:
        now = time.monotonic()
        self.window.append((now, self.c.completed, self.c.tokens_out))
        if self.bar is not None:
            _, tps = self.rates()
            self.bar.set_postfix_str(f"{tps:.0f} tok/s, " + " ".join(
                f"{e.inflight}/{e.capacity}" if e.up else "down" for e in self.endpoints))
        log.info("generate: %s", self.line())
        self.write()

    def record(self) -> dict[str, Any]:
        """What `write` puts in the progress file: counts over the whole output (this run and before)."""
        cps, tps = self.rates()
        left = self.left()
        c = self.c
        return {
            "updated": round(time.time(), 3),  # wall clock, so a reader can tell a stalled writer
            "elapsed_s": round(time.monotonic() - self.t0, 3),
            "done": self.already_done + c.completed, "total": self.already_done + c.total,
            "already_done": self.already_done, "completed": c.completed, "rejected": c.rejected,
            "completions_per_s": round(cps, 3), "tokens_out_per_s": round(tps, 1),
            "eta_s": round(left / cps, 1) if cps > 0 else (0.0 if not left else None),
            "endpoints_up": sum(1 for e in self.endpoints if e.up), "endpoints": len(self.endpoints),
        }

    def write(self) -> None:
        """Rewrite the progress file atomically; a failed write is logged, never fatal to the run."""
        if self.path is None:
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            tmp.write_text(json.dumps(self.record()) + "\n")
            os.replace(tmp, self.path)
        except OSError as e:
            log.warning("generate: cannot write the progress file %s: %s", self.path, e)

    async def run(self) -> None:
        import asyncio

        while True:
            await asyncio.sleep(self.interval_s)
            self.tick()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def summary(self, **extra: Any) -> dict[str, Any]:
        elapsed = time.monotonic() - self.t0
        c = self.c
        return {
            "elapsed_s": round(elapsed, 3),
            "completed": c.completed, "turns": c.turns, "skipped_done": c.skipped_done,
            "skipped_budget": c.skipped_budget, "rejected": c.rejected,
            "rejected_by_endpoint": c.rejected_by_endpoint,
            "flagged": dict(c.flagged), "retried_flagged": c.retried_flagged,
            "requeued": c.requeued, "server_errors": c.server_errors, "aborted": c.aborted,
            "transport_errors": c.transport_errors,
            "tokens_out": c.tokens_out,
            "completions_per_s": round(c.completed / elapsed, 3) if elapsed > 0 else 0.0,
            "tokens_out_per_s": round(c.tokens_out / elapsed, 1) if elapsed > 0 else 0.0,
            "endpoints": {e.url: e.stats() for e in self.endpoints},
            **extra,
        }

    def log_summary(self, s: dict[str, Any]) -> None:
        log.info("generate: finished in %s: %d conversations completed (%d turns, %.1f/s, "
                 "%.0f out tok/s), "
                 "%d already done, %d skipped by the token budget, %d rejected, flagged %s (%d retried), "
                 "%d re-queued, %d server errors, %d aborted, %d transport errors with /health up",
                 fmt_duration(s["elapsed_s"]), s["completed"], s["turns"], s["completions_per_s"],
                 s["tokens_out_per_s"], s["skipped_done"], s["skipped_budget"], s["rejected"],
                 s["flagged"] or "none", s["retried_flagged"], s["requeued"], s["server_errors"],
                 s["aborted"], s["transport_errors"])
        for url, e in s["endpoints"].items():
            log.info("generate:   %s: %d completed, %d errors, %d retried on a fresh connection, put aside "
                     "%d times, window %d (%s), %s", url, e["completed"], e["errors"], e["stale_retries"],
                     e["downs"], e["capacity"], e["window"], e["state"])
