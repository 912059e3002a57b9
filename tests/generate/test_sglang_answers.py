"""The generator against what real SGLang answers: empty thinking, aborted requests, capacity
reported only in internal_states, OpenAI-style `/v1` base URLs, 404 on the health probe, 503 while
starting. The endpoints are the SGLang double (tests/doubles/sglang_server.py), which answers as SGLang
does in each case; its docstring cites the SGLang functions it follows."""
from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from genhelpers import Double, check_output, read_output, sglang_double, write_prompts, write_run
from test_run import FAST, run_stage

from trainer.generate import endpoints


def write_empty_thinking_prompts(path: Path, n: int) -> dict[str, list[dict[str, str]]]:
    """n prompts; every third asks for an empty thinking (the double then closes </think> at once and
    writes a stray </think> inside the answer)."""
    expected = {}
    with path.open("w") as fh:
        for i in range(n):
            user = f"question {i}" + (f" {sglang_double.EMPTY_THINKING}" if i % 3 == 0 else "")
            expected[f"e{i:03d}"] = [{"role": "user", "content": user}]
            fh.write(json.dumps({"id": f"e{i:03d}", "messages": expected[f"e{i:03d}"]}) + "\n")
    return expected


@pytest.mark.parametrize("parser", ["qwen3", ""])
def test_empty_thinking_keeps_the_answer_whole(tmp_path: Path, sglang: Any, parser: str) -> None:
    # defect 1: with the reasoning parser, SGLang answers reasoning_content null for an empty thinking;
    # the answer must not be cut again at a stray </think> inside it
    d = sglang("--latency", "0.01", *(["--reasoning-parser", parser] if parser else []))
    expected = write_empty_thinking_prompts(tmp_path / "p.jsonl", 30)
    rc, summary = run_stage(write_run(tmp_path, tmp_path / "p.jsonl", [d.url]))
    assert rc == 0 and summary["completed"] == 30
    records = check_output(tmp_path / "run" / "generated", expected)
    empty = [r for r in records if sglang_double.EMPTY_THINKING in r["messages"][0]["content"]]
    assert len(empty) == 10
    for r in empty:
        answer = r["messages"][-1]
        assert answer["reasoning_content"] == "" and "</think>" in answer["content"]


def test_null_reasoning_from_a_parsing_server_is_the_answer_as_given() -> None:
    msg = {"role": "assistant", "content": "x </think> y", "reasoning_content": None}
    body = {"choices": [{"message": msg, "finish_reason": "stop"}], "usage": {"completion_tokens": 4}}
    parsed = endpoints.parse_completion(body, server_parses_reasoning=True)
    assert (parsed.content, parsed.reasoning) == ("x </think> y", "")
    # a server without a reasoning parser: the thinking is inline and split here
    inline = endpoints.parse_completion(body, server_parses_reasoning=False)
    assert (inline.content, inline.reasoning) == ("y", "x")


def test_aborted_completions_are_requeued_and_never_written(tmp_path: Path, sglang: Any) -> None:
    # defect 2: HTTP 200 + finish_reason "abort" + partial text is not a completion
    d = sglang(*FAST, "--abort-rate", "0.3", "--seed", "3")
    expected = write_prompts(tmp_path / "p.jsonl", 120)
    rc, summary = run_stage(write_run(tmp_path, tmp_path / "p.jsonl", [d.url], max_attempts=20))
    assert rc == 0
    records = check_output(tmp_path / "run" / "generated", expected)  # every finish_reason is "stop"
    assert len(records) == 120
    aborted = d.stats()["aborted"]
    assert aborted > 10 and summary["aborted"] == aborted and summary["completed"] == 120
    assert summary["flagged"] == {} and summary["server_errors"] == 0


def test_a_prompt_aborted_max_attempts_times_is_rejected(tmp_path: Path, sglang: Any) -> None:
    d = sglang(*FAST, "--abort-rate", "1.0")
    write_prompts(tmp_path / "p.jsonl", 3)
    rc, summary = run_stage(write_run(tmp_path, tmp_path / "p.jsonl", [d.url], max_attempts=2))
    assert rc == 0 and summary["completed"] == 0 and summary["rejected_by_endpoint"] == 3
    assert read_output(tmp_path / "run" / "generated") == []
    lines = (tmp_path / "run/generated/_state/rejects.ndjson").read_text().splitlines()
    rejects = [json.loads(x) for x in lines]
    assert sorted(r["id"] for r in rejects) == ["s00000", "s00001", "s00002"]
    for r in rejects:
        assert r["reason"].startswith("failed 2 times") and "finish_reason abort" in r["reason"]
    assert d.stats()["aborted"] == 6


def test_window_is_the_effective_value_when_max_running_requests_is_null(tmp_path: Path, sglang: Any,
                                                                         caplog: Any) -> None:
    # defect 3: started without --max-running-requests, SGLang reports null and the effective value
    # only in internal_states[0].effective_max_running_requests_per_dp
    caplog.set_level(logging.INFO, logger="trainer.generate")
    unset = sglang(*FAST, "--max-running", "12", "--max-running-unset")
    old = sglang(*FAST, "--max-running", "9", "--no-server-info")  # only /get_server_info
    expected = write_prompts(tmp_path / "p.jsonl", 80)
    rc, summary = run_stage(write_run(tmp_path, tmp_path / "p.jsonl", [unset.url, old.url]))
    assert rc == 0
    check_output(tmp_path / "run" / "generated", expected)
    assert summary["endpoints"][unset.url]["capacity"] == 12
    assert summary["endpoints"][old.url]["capacity"] == 9
    assert unset.stats()["max_seen_running"] <= 12
    assert (f"endpoint {unset.url}: healthy, window 12 (/server_info: max_running_requests is null, "
            "internal_states[0].effective_max_running_requests_per_dp 12 x dp_size 1)") in caplog.text
    assert f"endpoint {old.url}: healthy, window 9 (/get_server_info: max_running_requests 9)" in caplog.text


def test_window_from_server_info_says_why() -> None:
    assert endpoints.window_from_server_info({"max_running_requests": 48}) == (48, "max_running_requests 48")
    states = [{"effective_max_running_requests_per_dp": 256}, {"effective_max_running_requests_per_dp": 256}]
    info = {"max_running_requests": None, "dp_size": 2, "internal_states": states}
    assert endpoints.window_from_server_info(info) == (
        512, "max_running_requests is null, internal_states[0].effective_max_running_requests_per_dp 256 "
        "x dp_size 2")
    assert endpoints.window_from_server_info({"max_running_requests": None, "internal_states": []}) == (
        None, "neither max_running_requests nor internal_states[0].effective_max_running_requests_per_dp")


class HealthOnly(BaseHTTPRequestHandler):
    """A server that answers /health and nothing else (as a proxy in front of SGLang may)."""

    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, fmt: str, *args: object) -> None:
        pass


def test_an_unknown_window_falls_back_loudly(caplog: Any) -> None:
    from trainer.generate.config import GenerateConfig
    from trainer.generate.endpoints import Endpoint

    server = ThreadingHTTPServer(("127.0.0.1", 0), HealthOnly)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"

    async def probe() -> Endpoint:
        ep = Endpoint(url, GenerateConfig(default_concurrency=7))
        try:
            assert await ep.probe()
        finally:
            await ep.aclose()
        return ep

    try:
        ep = asyncio.run(probe())
    finally:
        server.shutdown()
        server.server_close()
    assert ep.capacity == 7
    assert ep.window_reason == ("generate.default_concurrency: the server did not say "
                                "(/server_info: HTTP 404; /get_server_info: HTTP 404)")
    assert ep.parses_reasoning is None  # unknown: answers are split as inline <think> text


def test_openai_style_v1_base_urls_work(tmp_path: Path, sglang: Any) -> None:
    # defect 4: http://host:port/v1 is how OpenAI clients write the base URL
    d = sglang(*FAST)
    expected = write_prompts(tmp_path / "p.jsonl", 40)
    rc, summary = run_stage(write_run(tmp_path, tmp_path / "p.jsonl", [d.url + "/v1/"],
                                      all_down_timeout_s=5.0))
    assert rc == 0 and summary["completed"] == 40
    check_output(tmp_path / "run" / "generated", expected)
    assert summary["endpoints"][d.url + "/v1"]["capacity"] == 24


def test_a_404_on_the_health_probe_is_a_configuration_error_reported_at_once(tmp_path: Path, sglang: Any,
                                                                             caplog: Any) -> None:
    d = sglang(*FAST)
    write_prompts(tmp_path / "p.jsonl", 5)
    t0 = time.monotonic()
    rc, _ = run_stage(write_run(tmp_path, tmp_path / "p.jsonl", [d.url + "/openai"], all_down_timeout_s=30.0))
    assert rc == 1 and time.monotonic() - t0 < 10
    assert "every endpoint is disabled" in caplog.text
    assert f"{d.url}/openai/health: HTTP 404" in caplog.text


def test_503_while_starting_is_waited_for(tmp_path: Path, caplog: Any) -> None:
    caplog.set_level(logging.INFO, logger="trainer.generate")
    d = Double([*FAST, "--startup-s", "1.5"], healthy=False)
    try:
        expected = write_prompts(tmp_path / "p.jsonl", 20)
        rc, summary = run_stage(write_run(tmp_path, tmp_path / "p.jsonl", [d.url]))
        assert rc == 0 and summary["completed"] == 20
        check_output(tmp_path / "run" / "generated", expected)
    finally:
        d.stop()
    assert "not healthy yet (/health: HTTP 503)" in caplog.text


def test_sampling_parameters_reach_the_server(tmp_path: Path, sglang: Any) -> None:
    d = sglang(*FAST)
    write_prompts(tmp_path / "p.jsonl", 2)
    rc, _ = run_stage(write_run(tmp_path, tmp_path / "p.jsonl", [d.url], temperature=0.7, top_p=0.8,
                                top_k=40, min_p=0.05))
    assert rc == 0
    assert d.stats()["sampling"] == {"temperature": 0.7, "top_p": 0.8, "top_k": 40, "min_p": 0.05}
    rc, _ = run_stage(write_run(tmp_path / "defaults", tmp_path / "p.jsonl", [d.url]))
    assert rc == 0  # the defaults: Qwen3's thinking-mode recommendation, sent explicitly
    assert d.stats()["sampling"] == {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0}


@pytest.mark.parametrize(("backoff_s", "said"), [(0.2, "0.2s"), (1.6, "1.6s"), (60.0, "60s")])
def test_a_sub_second_backoff_is_logged_as_it_is(backoff_s: float, said: str, caplog: Any) -> None:
    from trainer.generate.config import GenerateConfig
    from trainer.generate.endpoints import Endpoint

    async def put_aside() -> None:
        ep = Endpoint("http://127.0.0.1:9", GenerateConfig(backoff_initial_s=backoff_s))
        ep.up = True
        assert ep.mark_down("reset")
        await ep.aclose()

    asyncio.run(put_aside())
    assert f"endpoint http://127.0.0.1:9 put aside for {said}: reset (0 requests in flight re-queued)" \
        in caplog.text
