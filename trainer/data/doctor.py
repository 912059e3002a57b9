"""The dataset doctor: per-sample and dataset statistics, and a verdict that can refuse the data.

It reads one row of facts per rendered sample (see `SAMPLE_COLUMNS`; `prepare` writes them to
`samples.arrow`, kept and dropped rows alike) and reports: supervised tokens per sample (distribution,
histogram, mode), the share with fewer than N supervised tokens, empty and duplicate responses,
unterminated think blocks, the truncation rate and the response-length distribution.

A sample is *degenerate* when its response is empty, it has fewer than `min_supervised_tokens`
supervised tokens, or no two consecutive supervised tokens (no DFlash anchor). The dataset is refused
when the degenerate share (or another check's share) exceeds its configured limit — a set that is mostly
empty responses (87%, loss_mask sum exactly 6) is refused with a report that says so.
"""
from __future__ import annotations

import dataclasses
import re
import statistics
from collections import Counter
from collections.abc import Sequence
from typing import Any

from trainer.data.config import DoctorConfig
from trainer.data.shards import length_histogram

SAMPLE_COLUMNS = (
    "id", "turn", "length", "n_supervised", "longest_run", "answer_chars", "reasoning_chars",
    "finish_reason", "unterminated_think", "gen_truncated", "truncated", "response_hash", "kept",
)


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    passed: bool
    reasons: tuple[str, ...]
    stats: dict[str, Any]
    report: str

    def to_json(self, digest: str, thresholds: DoctorConfig) -> dict[str, Any]:
        return {"passed": self.passed, "reasons": list(self.reasons), "stats": self.stats,
                "thresholds": dataclasses.asdict(thresholds), "data_digest": digest}


def degenerate_flags(cols: dict[str, Sequence[Any]], cfg: DoctorConfig) -> list[bool]:
    """Per sample: empty response, too few supervised tokens, or no 2-token supervised run."""
    return [
        (a == 0 and r == 0) or s < cfg.min_supervised_tokens or run < 2
        for a, r, s, run in zip(cols["answer_chars"], cols["reasoning_chars"], cols["n_supervised"],
                                cols["longest_run"], strict=True)
    ]


def _dist(values: Sequence[int]) -> dict[str, float]:
    if not values:
        return {}
    s = sorted(values)

    def q(p: float) -> int:
        return s[min(len(s) - 1, int(p * len(s)))]

    return {"min": s[0], "p10": q(0.10), "p50": q(0.50), "mean": round(statistics.fmean(s), 1),
            "p90": q(0.90), "p99": q(0.99), "max": s[-1]}


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def diagnose(cols: dict[str, Sequence[Any]], cfg: DoctorConfig) -> Verdict:
    """Statistics and verdict for the samples in `cols` (column name -> one value per sample)."""
    missing = [c for c in SAMPLE_COLUMNS if c not in cols]
    if missing:
        raise ValueError(f"doctor: per-sample table lacks columns {missing}")
    n = len(cols["id"])
    if n == 0:
        return Verdict(False, ("the dataset is empty: no samples",), {"samples": 0}, "doctor: no samples\n")
    sup = [int(x) for x in cols["n_supervised"]]
    degenerate = degenerate_flags(cols, cfg)
    empty = [a == 0 and r == 0 for a, r in zip(cols["answer_chars"], cols["reasoning_chars"], strict=True)]
    no_answer = [a == 0 and r > 0 and not t for a, r, t in
                 zip(cols["answer_chars"], cols["reasoning_chars"], cols["gen_truncated"], strict=True)]
    short = [s < cfg.min_supervised_tokens for s in sup]
    no_anchor = [run < 2 for run in cols["longest_run"]]
    seen: set[str] = set()
    dup = 0
    for h, e in zip(cols["response_hash"], empty, strict=True):
        if e:
            continue
        dup += h in seen
        seen.add(h)
    mode_value, mode_count = Counter(sup).most_common(1)[0]
    share = {
        "degenerate": sum(degenerate) / n, "empty_response": sum(empty) / n, "no_answer": sum(no_answer) / n,
        "short": sum(short) / n, "no_anchor": sum(no_anchor) / n, "duplicate": dup / n,
        "unterminated_think": sum(map(bool, cols["unterminated_think"])) / n,
        "truncated": sum(map(bool, cols["truncated"])) / n,
        "generation_truncated": sum(map(bool, cols["gen_truncated"])) / n,
        "mode": mode_count / n,
    }
    stats: dict[str, Any] = {
        "samples": n, "records": len(set(cols["id"])), "kept": sum(map(bool, cols["kept"])),
        "supervised_tokens": _dist(sup), "supervised_tokens_histogram": length_histogram(sup, (
            2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)),
        "supervised_tokens_mode": {"value": mode_value, "count": mode_count},
        "total_supervised_tokens": sum(sup),
        "length": _dist([int(x) for x in cols["length"]]),
        "finish_reasons": dict(Counter(cols["finish_reason"]).most_common(8)),
        "share": {k: round(v, 6) for k, v in share.items()},
    }
    reasons = []
    if share["degenerate"] > cfg.max_degenerate_share:
        parts = [f"{_pct(share['empty_response'])} empty responses",
                 f"{_pct(share['short'])} with < {cfg.min_supervised_tokens} supervised tokens"]
        if share["no_anchor"]:
            parts.append(f"{_pct(share['no_anchor'])} without 2 consecutive supervised tokens")
        reasons.append(f"{_pct(share['degenerate'])} of samples are degenerate ({', '.join(parts)}); "
                       f"limit {_pct(cfg.max_degenerate_share)} (data.doctor.max_degenerate_share)")
    if mode_value < cfg.mode_min_tokens and share["mode"] > cfg.max_mode_share:
        reasons.append(f"{_pct(share['mode'])} of samples have exactly {mode_value} supervised tokens "
                       f"(the mode; limit {_pct(cfg.max_mode_share)}, data.doctor.max_mode_share): "
                       "template tokens around an empty response?")
    for key, field, what in (
        ("duplicate", "max_duplicate_share", "duplicate responses"),
        ("truncated", "max_truncated_share", "rows truncated at max_length"),
        ("unterminated_think", "max_unterminated_share", "unterminated <think> blocks"),
    ):
        limit = getattr(cfg, field)
        if share[key] > limit:
            reasons.append(f"{_pct(share[key])} {what}; limit {_pct(limit)} (data.doctor.{field})")
    passed = not reasons
    return Verdict(passed, tuple(reasons), stats, format_report(stats, reasons, cfg))


def refused_flags(reasons: Sequence[str]) -> list[str]:
    """The `doctor` options that re-judge the checks a verdict failed (`--max-truncated-share` ...)."""
    found = re.findall(r"data\.doctor\.(max_\w+)", " ".join(reasons))
    return ["--" + name.replace("_", "-") for name in dict.fromkeys(found)]


def format_report(stats: dict[str, Any], reasons: Sequence[str], cfg: DoctorConfig) -> str:
    sh = stats["share"]
    sup = stats["supervised_tokens"]
    mode = stats["supervised_tokens_mode"]
    lines = [
        f"doctor: {stats['samples']} samples from {stats['records']} records, {stats['kept']} kept, "
        f"{stats['total_supervised_tokens']} supervised tokens",
        "  supervised tokens/sample: " + ", ".join(f"{k} {v}" for k, v in sup.items()),
        f"  mode: {mode['value']} tokens ({mode['count']} samples, {_pct(sh['mode'])})",
        "  histogram: " + ", ".join(f"{k}: {v}" for k, v in stats["supervised_tokens_histogram"].items()),
        "  sample length: " + ", ".join(f"{k} {v}" for k, v in stats["length"].items()),
        f"  degenerate {_pct(sh['degenerate'])} (limit {_pct(cfg.max_degenerate_share)}): "
        f"empty response {_pct(sh['empty_response'])}, < {cfg.min_supervised_tokens} supervised tokens "
        f"{_pct(sh['short'])}, no 2-token run {_pct(sh['no_anchor'])}",
        f"  thinking but no answer {_pct(sh['no_answer'])}, duplicates {_pct(sh['duplicate'])}, "
        f"unterminated <think> {_pct(sh['unterminated_think'])}",
        f"  truncated at max_length {_pct(sh['truncated'])}, "
        f"stopped by the generator's limit {_pct(sh['generation_truncated'])}",
        "  finish reasons: " + ", ".join(f"{k or '(none)'} {v}" for k, v in stats["finish_reasons"].items()),
    ]
    if reasons:
        lines.append("REFUSED:")
        lines.extend(f"  - {r}" for r in reasons)
    else:
        lines.append("PASSED")
    return "\n".join(lines) + "\n"
