"""`python -m trainer status RUN.yml`: how a run is going, read from the run's own files.

Which stages have finished and where the run is now: generate's progress (its progress file, else the
spool's counts; its manifest says when it is complete), prepare's manifest (rows, tokens, the doctor's
verdict), train's `metrics.jsonl` (step, throughput, MFU and ETA over the last `window` steps, last loss
and tau) and latest checkpoint, and eval's latest result. Read-only, no torch: it runs beside a live run.

Throughput is computed here from the per-step lines (sum of tokens / sum of step times over the window),
not taken from the trainer's periodic log lines; ETA = remaining steps x mean step time of the window.
Lines written before a key existed are shown with what they have.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from trainer.cli_args import EXIT_BAD_INPUT, add_run_config_args, load_from_args
from trainer.config import RunConfig
from trainer.layout import EVAL_PATTERN, RunLayout, latest_checkpoint

DEFAULT_WINDOW = 50  # optimizer steps the throughput, step time, MFU and ETA are averaged over

PENDING, RUNNING, DONE = "not started", "in progress", "done"


class StatusError(RuntimeError):
    """A run file that cannot be read as written (the message names the file and line)."""


# ------------------------------------------------------------------------------------------------ readers
def _read_json(path: Path) -> Any:
    """A JSON file, or None when it does not exist."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise StatusError(f"{path}: cannot read ({e.strerror})") from e
    try:
        return json.loads(text)
    except ValueError as e:
        raise StatusError(f"{path}: not valid JSON ({e})") from e


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def read_metrics(path: Path, window: int) -> tuple[int, list[dict[str, Any]]]:
    """(number of step lines, the last `window` of them) of a metrics.jsonl. A last line with no newline
    that does not parse is the one being written, and is left out; any other bad line is a StatusError
    naming the file and the line."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return 0, []
    except OSError as e:
        raise StatusError(f"{path}: cannot read ({e.strerror})") from e
    lines = data.split(b"\n")
    numbered = [(i + 1, ln) for i, ln in enumerate(lines) if ln.strip()]
    if lines[-1].strip():  # a last line without its newline: the one being written, unless it parses
        try:
            json.loads(lines[-1])
        except ValueError:
            numbered.pop()
    out: list[dict[str, Any]] = []
    for no, raw in numbered[-max(1, window):]:
        try:
            rec = json.loads(raw)
        except ValueError as e:
            raise StatusError(f"{path} line {no}: not a JSON object ({e}): {raw[:120]!r}") from None
        if not isinstance(rec, dict) or not isinstance(rec.get("step"), int):
            raise StatusError(f"{path} line {no}: expected a JSON object with an integer \"step\": "
                              f"{raw[:120]!r}")
        out.append(rec)
    return len(numbered), out


# ------------------------------------------------------------------------------------------------ stages
def generate_status(layout: RunLayout, now: float) -> dict[str, Any]:
    """From the output dir: manifest.json (complete?), _state/progress.json (live figures), summary.json
    (the finished run), else the spool itself (sealed shards' sidecars + lines of the open shards)."""
    manifest = _read_json(layout.generate_manifest)
    progress = _read_json(layout.generate_progress)
    summary = _read_json(layout.generate_summary)
    st: dict[str, Any] = {"state": PENDING, "output": str(layout.generate_output)}
    if isinstance(manifest, dict) and manifest.get("complete"):
        st.update(state=DONE, done=int(manifest.get("records", 0)), rejected=manifest.get("rejected"))
        if isinstance(summary, dict):
            st.update(completions_per_s=summary.get("completions_per_s"),
                      tokens_out_per_s=summary.get("tokens_out_per_s"), elapsed_s=summary.get("elapsed_s"))
        return st
    if isinstance(progress, dict):
        st.update(state=RUNNING, **{k: progress.get(k) for k in (
            "done", "total", "rejected", "completions_per_s", "tokens_out_per_s", "eta_s", "endpoints_up",
            "endpoints")})
        if isinstance(progress.get("updated"), int | float):
            st["updated_s_ago"] = round(max(0.0, now - progress["updated"]), 1)
        return st
    sealed = 0
    for side in sorted(layout.generate_sidecars.glob("*.json")):
        rec = _read_json(side)
        sealed += int(rec.get("records", 0)) if isinstance(rec, dict) else 0
    open_lines = 0
    for p in layout.generate_open.glob("*.jsonl"):
        with contextlib.suppress(FileNotFoundError):  # sealed meanwhile: counted by the next status
            open_lines += p.read_bytes().count(b"\n")
    if sealed or open_lines or isinstance(manifest, dict):
        st.update(state=RUNNING, done=sealed + open_lines, total=None)
    return st


def prepare_status(layout: RunLayout) -> dict[str, Any]:
    path = layout.shards_manifest
    manifest = _read_json(path)
    st: dict[str, Any] = {"state": PENDING, "shards": str(layout.shards)}
    if manifest is None:
        return st
    if not isinstance(manifest, dict):
        raise StatusError(f"{path}: expected a JSON object")
    counts = manifest.get("counts") or {}
    doctor = manifest.get("doctor") or {}
    st.update(state=DONE, **{k: counts.get(k) for k in ("records", "samples", "rows", "tokens",
                                                        "supervised_tokens")},
              doctor_passed=doctor.get("passed"), doctor_reasons=list(doctor.get("reasons") or []))
    return st


def _sum(lines: list[dict[str, Any]], key: str) -> float:
    return float(sum(ln[key] for ln in lines))


def _num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def train_status(layout: RunLayout, window: int, now: float) -> dict[str, Any]:
    count, lines = read_metrics(layout.metrics, window)
    ckpt = latest_checkpoint(layout.checkpoints)
    meta = _read_json(ckpt / "meta.json") if ckpt is not None else None
    meta = meta if isinstance(meta, dict) else {}
    st: dict[str, Any] = {"state": PENDING, "metrics": str(layout.metrics),
                          "checkpoint": str(ckpt) if ckpt is not None else None,
                          "checkpoint_step": meta.get("step")}
    last = lines[-1] if lines else {}
    step = last.get("step", meta.get("step"))
    total = last.get("total_steps") if _num(last.get("total_steps")) else meta.get("total_steps")
    if step is None:
        return st
    st.update(state=RUNNING, step=step, total_steps=total,
              **{k: last.get(k) for k in ("loss", "tau", "lr", "grad_norm")})
    mtime = _mtime(layout.metrics)
    if mtime is not None:
        st["updated_s_ago"] = round(max(0.0, now - mtime), 1)
    for k in ("loss", "tau"):
        vals = [ln[k] for ln in lines if _num(ln.get(k))]
        st[f"{k}_mean"] = sum(vals) / len(vals) if vals else None
    # throughput over the window's lines that carry a step time (older runs' lines do not)
    timed = [ln for ln in lines if _num(ln.get("step_time_s")) and ln["step_time_s"] > 0]
    seconds = _sum(timed, "step_time_s")
    st["window_steps"] = len(timed)
    for key, rate in (("samples", "samples_per_s"), ("tokens", "tokens_per_s"),
                      ("supervised_tokens", "supervised_tokens_per_s")):
        have = [ln for ln in timed if _num(ln.get(key))]
        st[rate] = _sum(have, key) / _sum(have, "step_time_s") if have else None
    st["step_time_s"] = seconds / len(timed) if timed else None
    with_mfu = [ln for ln in timed if _num(ln.get("mfu"))]
    # time-weighted: the window's achieved FLOPs over what the peak would have done in the same time
    st["mfu"] = (sum(ln["mfu"] * ln["step_time_s"] for ln in with_mfu) / _sum(with_mfu, "step_time_s")
                 if with_mfu else None)
    remaining = max(0, total - step) if _num(total) else None
    st["eta_s"] = (remaining * st["step_time_s"] if remaining is not None and st["step_time_s"] is not None
                   else None)
    exported = _newest_mtime(layout.export)
    # done: the last step reached, or the drafter exported after the last step (data ran out early)
    if (_num(total) and step >= total) or (exported is not None and exported >= (mtime or 0)):
        st["state"] = DONE
        st["eta_s"] = 0.0
    if exported is not None:
        st["export"] = str(layout.export)
    st["logged_steps"] = count
    return st


def _newest_mtime(directory: Path) -> float | None:
    if not directory.is_dir():
        return None
    times = [t for p in directory.iterdir() if (t := _mtime(p)) is not None]
    return max(times) if times else None


def eval_status(layout: RunLayout, train_step: int | None) -> dict[str, Any]:
    results = sorted(layout.eval_dir.glob(EVAL_PATTERN)) if layout.eval_dir.is_dir() else []
    st: dict[str, Any] = {"state": PENDING, "eval_dir": str(layout.eval_dir)}
    if not results:
        return st
    res = _read_json(results[-1])
    if not isinstance(res, dict):
        raise StatusError(f"{results[-1]}: expected a JSON object")
    st.update(result=str(results[-1]), step=res.get("step"), tau=res.get("tau_mean"),
              samples=res.get("samples"), blocks=res.get("blocks"))
    # a result for an older checkpoint than the one trained last is the previous round's
    st["state"] = DONE if train_step is None or not _num(res.get("step")) or res["step"] >= train_step \
        else PENDING
    return st


# ------------------------------------------------------------------------------------------------ the run
def run_status(cfg: RunConfig, *, base: str | Path | None = None, window: int = DEFAULT_WINDOW,
               now: float | None = None) -> dict[str, Any]:
    """The status of run `cfg` from its files (`base`: the trainer's working directory for a relative
    run_dir, default this process's)."""
    now = time.time() if now is None else now
    layout = RunLayout.of(cfg, Path.cwd() if base is None else base)
    out: dict[str, Any] = {"run": cfg.name, "run_dir": str(layout.root), "stages": list(cfg.stages)}
    p = cfg.train.placement
    if p.nnodes > 1:
        out["node"] = {"rank": p.node_rank, "nodes": p.nnodes}
    if p.nnodes > 1 and p.node_rank > 0:  # its ranks train in the job; node 0 holds what there is to show
        started = train_status(layout, window, now)["state"] != PENDING
        out.update(stages=[], stage="other node", started=started)
        return out
    stages: dict[str, dict[str, Any]] = {}
    train_step = None
    for name in cfg.stages:
        if name == "generate":
            stages[name] = generate_status(layout, now)
        elif name == "prepare":
            stages[name] = prepare_status(layout)
        elif name == "train":
            stages[name] = train_status(layout, window, now)
            train_step = stages[name].get("checkpoint_step") or stages[name].get("step")
        elif name == "eval":
            stages[name] = eval_status(layout, train_step if "train" in cfg.stages else None)
    states = [s["state"] for s in stages.values()]
    if not states or all(s == PENDING for s in states):
        out["stage"] = "not started"
    elif all(s == DONE for s in states):
        out["stage"] = "finished"
    else:
        out["stage"] = next(n for n, s in stages.items() if s["state"] != DONE)
    out["started"] = out["stage"] != "not started"
    out.update(stages)
    return out


# ------------------------------------------------------------------------------------------------ report
def fmt_duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "?"
    s = round(seconds)
    if s >= 86400:
        return f"{s // 86400}d{s % 86400 // 3600:02d}h"
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def _f(v: Any, spec: str, unit: str = "", missing: str = "?") -> str:
    return f"{format(v, spec)}{unit}" if _num(v) else missing


def _ago(st: dict[str, Any]) -> str:
    return f" (updated {fmt_duration(st['updated_s_ago'])} ago)" if _num(st.get("updated_s_ago")) else ""


def _generate_lines(st: dict[str, Any]) -> list[str]:
    if st["state"] == PENDING:
        return [f"not started (nothing under {st['output']})"]
    if st["state"] == DONE:
        line = f"done: {st['done']:,} conversations"
        if st.get("rejected") is not None:
            line += f", {st['rejected']:,} rejected"
        if _num(st.get("completions_per_s")):
            line += (f"; last run {_f(st['completions_per_s'], '.2f')} compl/s, "
                     f"{_f(st.get('tokens_out_per_s'), ',.0f')} out tok/s "
                     f"in {fmt_duration(st.get('elapsed_s'))}")
        return [line]
    if st.get("total") is None:
        return [f"{st['done']:,} conversations written (no progress file: total, rate and ETA unknown)"]
    pct = f" ({100 * st['done'] / st['total']:.1f}%)" if st["total"] else ""
    rej = f", {st['rejected']:,} rejected" if st.get("rejected") else ""
    eps = (f", endpoints up {st['endpoints_up']}/{st['endpoints']}"
           if st.get("endpoints") is not None else "")
    return [f"{st['done']:,}/{st['total']:,} conversations done{pct}{rej}{_ago(st)}",
            f"{_f(st.get('completions_per_s'), '.2f')} compl/s, {_f(st.get('tokens_out_per_s'), ',.0f')} "
            f"out tok/s, ETA {fmt_duration(st.get('eta_s'))}{eps}"]


def _prepare_lines(st: dict[str, Any]) -> list[str]:
    if st["state"] == PENDING:
        return [f"not started (no manifest in {st['shards']})"]
    doctor = {True: "doctor passed", False: "doctor refused: " + "; ".join(st["doctor_reasons"]),
              None: "doctor did not run"}[st.get("doctor_passed")]
    return [f"done: {_f(st.get('rows'), ',d')} rows from {_f(st.get('samples'), ',d')} samples, "
            f"{_f(st.get('tokens'), ',d')} tokens ({_f(st.get('supervised_tokens'), ',d')} supervised), "
            f"{doctor}"]


def _train_lines(st: dict[str, Any]) -> list[str]:
    if st["state"] == PENDING:
        return [f"not started (no steps in {st['metrics']})"]
    total = st.get("total_steps")
    pct = f" ({100 * st['step'] / total:.1f}%)" if _num(total) and total else ""
    where = f"step {st['step']:,}/{_f(total, ',d')}{pct}" + (", done" if st["state"] == DONE else "")
    lines = [f"{where}{_ago(st)}",
             f"loss {_f(st.get('loss'), '.4f')} (mean {_f(st.get('loss_mean'), '.4f')}), "
             f"tau {_f(st.get('tau'), '.3f')} (mean {_f(st.get('tau_mean'), '.3f')}), "
             f"lr {_f(st.get('lr'), '.2e')}, grad norm {_f(st.get('grad_norm'), '.3f')}"]
    if st.get("window_steps"):
        mfu = _f(100 * st["mfu"], ".1f", "%") if _num(st.get("mfu")) else "n/a (no device peak: " \
            "train.placement.gpu_peak_tflops)"
        lines.append(f"{_f(st.get('samples_per_s'), ',.2f')} samples/s, {_f(st.get('tokens_per_s'), ',.0f')} "
                     f"tokens/s ({_f(st.get('supervised_tokens_per_s'), ',.0f')} supervised tokens/s), "
                     f"{_f(st.get('step_time_s'), '.3f')} s/step, MFU {mfu}, "
                     f"ETA {fmt_duration(st.get('eta_s'))} (last {st['window_steps']} steps)")
    else:
        lines.append("no step times in the metrics (a run from before they were recorded): "
                     "throughput, MFU and ETA unknown")
    ck = st.get("checkpoint")
    lines.append(f"latest checkpoint: {ck} (step {st.get('checkpoint_step')})" if ck else
                 "latest checkpoint: none yet")
    if st.get("export"):
        lines.append(f"exported for SGLang: {st['export']}")
    return lines


def _eval_lines(st: dict[str, Any]) -> list[str]:
    if "result" not in st:
        return [f"not run yet (nothing in {st['eval_dir']})"]
    res = (f"tau {_f(st.get('tau'), '.3f')} at step {st.get('step')} over {_f(st.get('samples'), ',d')} "
           f"samples ({st['result']})")
    return [res if st["state"] == DONE else f"not run on the latest checkpoint yet; last result: {res}"]


_LINES = {"generate": _generate_lines, "prepare": _prepare_lines, "train": _train_lines, "eval": _eval_lines}


def format_status(st: dict[str, Any]) -> str:
    head = {"not started": "not started: no stage has written anything yet",
            "finished": "finished: every stage is done"}.get(st["stage"], f"in stage {st['stage']}")
    node = st.get("node")
    if node and node["rank"]:
        head = (f"node {node['rank']} of {node['nodes']}: its ranks train in the job whose figures node 0's "
                "status shows (generate, prepare and eval run on node 0, and global rank 0 there writes the "
                "metrics, checkpoints and export)")
    elif node:
        head += f" (node 0 of {node['nodes']}: the job's figures)"
    out = [f"run {st['run']}: {head}", f"  run dir   {st['run_dir']}"]
    for name in st["stages"]:
        body = _LINES[name](st[name])
        out.append(f"  {name:<9} {body[0]}")
        out.extend(f"            {line}" for line in body[1:])
    return "\n".join(out)


# ------------------------------------------------------------------------------------------------ command
def _cmd(args: argparse.Namespace) -> int:
    cfg = load_from_args(args)
    try:
        st = run_status(cfg, window=args.window)
    except StatusError as e:
        print(f"error: run {cfg.name}: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT  # a run file that cannot be read
    print(json.dumps(st, indent=1) if args.json else format_status(st))
    return 0


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {n}")
    return n


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("status", help="how the run is going, from its files: stage, progress, throughput, "
                       "MFU, ETA, loss, tau, checkpoint, eval")
    add_run_config_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the report")
    p.add_argument("--window", type=_positive, default=DEFAULT_WINDOW, metavar="STEPS",
                   help=f"train steps the rates, MFU and ETA are averaged over (default {DEFAULT_WINDOW})")
    p.set_defaults(func=_cmd)
