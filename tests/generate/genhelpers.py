"""Helpers for the generator tests: SGLang doubles on loopback, prompt files, run configs, checks.

The endpoints are `tests/doubles/sglang_server.py` subprocesses — a double of SGLang's HTTP API (the
real SGLang cannot serve on these CPUs). Its completion is a pure function of the messages, so
`check_output` can prove that every id appears exactly once with the right content.
"""
from __future__ import annotations

import importlib.util
import json
import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOUBLE = ROOT / "tests" / "doubles" / "sglang_server.py"

_spec = importlib.util.spec_from_file_location("sglang_double", DOUBLE)
assert _spec and _spec.loader
sglang_double = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sglang_double)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Double:
    def __init__(self, args: list[str], ca: Path | None = None, healthy: bool = True) -> None:
        """With `ca`, args carry --tls-cert/--tls-key and the double serves HTTPS signed by that CA.
        With `healthy=False` start() returns as soon as the double answers HTTP at all (a 503 from
        /health while it is "starting" included)."""
        self.port = free_port()
        self.url = f"{'https' if ca else 'http'}://127.0.0.1:{self.port}"
        self.tls = ssl.create_default_context(cafile=str(ca)) if ca else None
        self.args = args
        self.healthy = healthy
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, str(DOUBLE), "--port", str(self.port), *self.args],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1, context=self.tls):
                    return
            except urllib.error.HTTPError:
                if not self.healthy:
                    return
                time.sleep(0.05)
            except OSError:
                if self.proc.poll() is not None:
                    rc = self.proc.returncode
                    raise RuntimeError(f"SGLang double on {self.url} exited with {rc}") from None
                time.sleep(0.05)
        raise RuntimeError(f"SGLang double on {self.url} did not come up")

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.url + "/double/stats", timeout=5, context=self.tls) as r:
            return json.loads(r.read())

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def write_prompts(path: Path, n: int, *, bad: bool = False) -> dict[str, list[dict[str, str]]]:
    """n prompts (alternating OpenAI and ShareGPT, with original assistant turns); returns id -> kept turns.
    With `bad`, malformed lines are mixed in (their expected reasons are in BAD_LINES)."""
    expected: dict[str, list[dict[str, str]]] = {}
    lines = []
    for i in range(n):
        pid = f"s{i:05d}"
        user = f"question {i}: explain {i % 17} things"
        if i % 2:
            obj = {"id": pid, "messages": [{"role": "system", "content": "be brief"},
                                           {"role": "user", "content": user},
                                           {"role": "assistant", "content": "old answer"}]}
            expected[pid] = [{"role": "system", "content": "be brief"}, {"role": "user", "content": user}]
        else:
            conv = [{"from": "human", "value": user}, {"from": "gpt", "value": "old"}]
            obj = {"id": pid, "conversations": conv}
            expected[pid] = [{"role": "user", "content": user}]
        lines.append(json.dumps(obj))
        if bad and i % 50 == 7:
            lines.append(BAD_LINES[(i // 50) % len(BAD_LINES)][0])
    path.write_text("\n".join(lines) + "\n")
    return expected


BAD_LINES = [
    ('{"id": "broken", "messages": [', "invalid JSON"),
    (json.dumps({"id": "nouser", "messages": [{"role": "system", "content": "s"},
                                               {"role": "assistant", "content": "a"}]}), "no user turn"),
    (json.dumps({"id": "long", "messages": [{"role": "user", "content": "x" * 5000}]}), "over-long"),
    (json.dumps({"id": "s00000", "messages": [{"role": "user", "content": "dup"}]}), "duplicate id"),
]


def write_run(tmp: Path, prompts: Path, endpoints: list[str], **generate: Any) -> Path:
    data: dict[str, Any] = {
        "name": "gen", "target": {"path": "/models/Qwen3.6-27B"}, "stages": ["generate"],
        "run_dir": str(tmp / "run"),
        "generate": {"prompts": str(prompts), "endpoints": endpoints, "max_tokens": 512,
                     "max_prompt_chars": 4000, "shard_records": 100, "progress_interval_s": 1.0,
                     "backoff_initial_s": 0.2, "backoff_max_s": 1.0, "request_timeout_s": 20.0, **generate},
    }
    s3 = data["generate"].pop("s3", None)
    if s3:
        data["s3"] = s3
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / "gen.yml"
    path.write_text(yaml.safe_dump(data))
    return path


def read_output(out: Path) -> list[dict[str, Any]]:
    """Every record of the sealed shards at the top of `out`."""
    from trainer.generate.store import read_records

    records = []
    for shard in sorted(out.glob("part-*")):
        records.extend(read_records(shard.read_bytes(), shard.name))
    return records


def check_output(out: Path, expected: dict[str, list[dict[str, str]]], thinking: bool = True) -> list[dict]:
    """Every expected id exactly once, with the kept turns and the double's deterministic completion."""
    records = read_output(out)
    counts = Counter(r["id"] for r in records)
    dups = [k for k, v in counts.items() if v > 1]
    assert not dups, f"ids written more than once: {dups[:10]}"
    missing = sorted(set(expected) - set(counts))
    assert not missing, f"{len(missing)} ids missing, e.g. {missing[:10]}"
    assert set(counts) == set(expected)
    for r in records:
        *turns, answer = r["messages"]
        assert turns == expected[r["id"]], r["id"]
        reasoning, content = sglang_double.expected_completion(turns, thinking)
        assert answer["role"] == "assistant"
        assert answer["content"] == content, r["id"]
        assert answer["reasoning_content"] == reasoning, r["id"]
        assert r["finish_reason"] == "stop"
        assert r["usage"]["completion_tokens"] > 0
        assert r["endpoint"].startswith(("http://127.0.0.1:", "https://127.0.0.1:"))
    return records


def trainer_env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
