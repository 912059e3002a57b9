#!/usr/bin/env python3
"""Throughput of `trainer generate` against SGLang doubles of known capacity.

Starts N doubles (tests/doubles/sglang_server.py, a stand-in for SGLang) that each decode at most
`--capacity` requests at once and answer every request after exactly `--latency` seconds. Their
theoretical capacity is N * capacity / latency completions/s. The generator runs in this process over
`--waves` full windows of prompts; the script prints the achieved rate as a share of that capacity
(the goal is >= 99%) and the client's CPU seconds per 1,000 completions.

    python bench/generate_throughput.py [--endpoints 7] [--capacity 64] [--latency 60] [--waves 3]

The default latency, 60 s, is still short for the job this models: regenerating 914K thinking-mode
completions on 7 x 64 slots takes days, about 170 s per completion. The loss is a fixed start (probes,
opening one connection per slot) plus the client's reaction time at each completion (~0.1 s when a
whole window finishes at once, as it does here), so shorter latencies show a smaller share:
`--latency 20` measures that worst case. The doubles count their service time from admission, so their
own CPU does not lower their capacity; on a shared 2-core machine they still compete with the client
for CPU, so the figure is a lower bound of what the client achieves against real servers.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOUBLE = ROOT / "tests" / "doubles" / "sglang_server.py"
sys.path.insert(0, str(ROOT))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_doubles(n: int, capacity: int, latency: float) -> tuple[list[subprocess.Popen], list[str]]:
    procs, urls = [], []
    for _ in range(n):
        port = free_port()
        procs.append(subprocess.Popen(
            [sys.executable, str(DOUBLE), "--port", str(port), "--max-running", str(capacity),
             "--latency", str(latency), "--reasoning-parser", "qwen3"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        urls.append(f"http://127.0.0.1:{port}")
    for url in urls:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"double {url} did not start") from None
                time.sleep(0.05)
    return procs, urls


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--endpoints", type=int, default=7)
    p.add_argument("--capacity", type=int, default=64, help="max running requests per double")
    p.add_argument("--latency", type=float, default=60.0, help="seconds per request")
    p.add_argument("--waves", type=int, default=3, help="prompts = waves * endpoints * capacity")
    p.add_argument("--format", default="jsonl.zst", choices=["jsonl.zst", "jsonl"])
    args = p.parse_args()

    import yaml

    from trainer.config import load_run_config
    from trainer.generate.cli import stage
    from trainer.layout import RunLayout

    logging.basicConfig(level=logging.WARNING)
    n = args.waves * args.endpoints * args.capacity
    procs, urls = start_doubles(args.endpoints, args.capacity, args.latency)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            prompts = Path(tmp) / "prompts.jsonl"
            with prompts.open("w") as fh:
                for i in range(n):
                    fh.write(json.dumps({"id": f"b{i}", "messages": [
                        {"role": "user", "content": f"benchmark prompt {i}"}]}) + "\n")
            cfg_path = Path(tmp) / "bench.yml"
            cfg_path.write_text(yaml.safe_dump({
                "name": "bench", "target": {"path": "/models/Qwen3.6-27B"}, "run_dir": f"{tmp}/run",
                "generate": {"prompts": str(prompts), "endpoints": urls, "max_tokens": 1024,
                             "format": args.format, "shard_records": 2000, "progress_interval_s": 3600,
                             "request_timeout_s": max(60.0, 10 * args.latency)}}))
            cfg = load_run_config(cfg_path)
            cpu0 = cpu_seconds()
            rc = stage(cfg)
            cpu = cpu_seconds() - cpu0
            summary = json.loads(RunLayout.of(cfg).generate_summary.read_text())
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    if rc != 0 or summary["completed"] != n:
        print(f"run failed: rc={rc}, completed {summary.get('completed')} of {n}")
        return 1
    capacity = args.endpoints * args.capacity / args.latency
    elapsed = summary["elapsed_s"]
    ideal = math.ceil(n / (args.endpoints * args.capacity)) * args.latency
    print(f"endpoints {args.endpoints} x capacity {args.capacity} at {args.latency:.2f}s/request "
          f"-> theoretical {capacity:.1f} completions/s")
    print(f"completions      {n} in {elapsed:.2f}s (ideal {ideal:.2f}s)")
    share = 100 * n / elapsed / capacity
    print(f"achieved         {n / elapsed:.1f} completions/s = {share:.2f}% of capacity")
    print(f"client CPU       {cpu:.2f}s = {1000 * cpu / n:.2f} CPU-s per 1,000 completions "
          f"(one core would feed {n / cpu:.0f} completions/s)")
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"machine load     {load} (1/5/15 min) on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
