"""The SGLang double itself: SGLang's response shapes, determinism, capacity, errors, auth, dying.

It stands in for SGLang (which cannot serve on CPU) in these tests, the bench and the lab, so its
contract is tested here: a double that drifted from SGLang's shapes would make every other test lie.
"""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from genhelpers import DOUBLE, sglang_double

from trainer.generate.endpoints import parse_completion, split_reasoning

MSGS = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "what is 2+2?"}]


def post(url: str, body: dict[str, Any], key: str = "") -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json",
                                          **({"Authorization": f"Bearer {key}"} if key else {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def get(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=10) as r:
        body = r.read()
        return json.loads(body) if body else {}


def test_shapes_with_the_qwen3_reasoning_parser(sglang: Any) -> None:
    d = sglang("--reasoning-parser", "qwen3", "--model", "Qwen/Qwen3.6-27B", "--max-running", "7")
    code, body = post(d.url, {"model": "Qwen/Qwen3.6-27B", "messages": MSGS, "max_tokens": 1000,
                              "chat_template_kwargs": {"enable_thinking": True}})
    assert code == 200
    assert body["object"] == "chat.completion"
    (choice,) = body["choices"]
    reasoning, answer = sglang_double.expected_completion(MSGS)
    assert choice["message"] == {"role": "assistant", "content": answer, "reasoning_content": reasoning,
                                 "tool_calls": None}
    assert choice["finish_reason"] == "stop" and choice["matched_stop"] == 151645
    u = body["usage"]
    assert u["completion_tokens"] == len(sglang_double.completion_tokens(MSGS))
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    assert get(d.url + "/get_server_info")["max_running_requests"] == 7
    assert get(d.url + "/get_model_info")["model_path"] == "Qwen/Qwen3.6-27B"
    assert get(d.url + "/v1/models")["data"][0]["id"] == "Qwen/Qwen3.6-27B"
    assert get(d.url + "/health") == {}
    # same prompt, same completion: duplicates and losses are detectable
    again = post(d.url, {"messages": MSGS, "max_tokens": 1000})[1]
    assert again["choices"][0]["message"] == choice["message"]
    assert parse_completion(body).content == answer


def test_inline_think_without_parser_truncation_and_no_thinking(sglang: Any) -> None:
    d = sglang()
    _, body = post(d.url, {"messages": MSGS, "max_tokens": 1000})
    content = body["choices"][0]["message"]["content"]
    assert body["choices"][0]["message"]["reasoning_content"] is None
    assert content.startswith("<think>\n") and "</think>" in content
    assert split_reasoning(content, None) == tuple(reversed(sglang_double.expected_completion(MSGS)))
    _, cut = post(d.url, {"messages": MSGS, "max_tokens": 3})
    assert cut["choices"][0]["finish_reason"] == "length" and cut["usage"]["completion_tokens"] == 3
    assert parse_completion(cut).content == "" and parse_completion(cut).flag == "length"
    _, plain = post(d.url, {"messages": MSGS, "chat_template_kwargs": {"enable_thinking": False}})
    assert plain["choices"][0]["message"]["content"] == sglang_double.expected_completion(MSGS, False)[1]


def test_bad_requests_get_sglang_errors(sglang: Any) -> None:
    d = sglang("--context-length", "100")
    code, body = post(d.url, {"messages": []})
    assert code == 400 and body["object"] == "error" and "messages" in body["message"]
    code, body = post(d.url, {"messages": MSGS, "max_tokens": 200})
    assert code == 400 and "maximum context length of 100" in body["message"]


def test_api_key_is_required_except_for_health(sglang: Any) -> None:
    d = sglang("--api-key", "s3cret")
    assert post(d.url, {"messages": MSGS})[0] == 401
    assert post(d.url, {"messages": MSGS}, key="s3cret")[0] == 200
    assert get(d.url + "/health") == {}


def test_max_running_caps_concurrency_and_latency_is_applied(sglang: Any) -> None:
    d = sglang("--max-running", "2", "--latency", "0.3")
    t0 = time.monotonic()
    bodies = [{"messages": [{"role": "user", "content": str(i)}]} for i in range(4)]
    threads = [threading.Thread(target=post, args=(d.url, b)) for b in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    assert elapsed >= 0.6  # two waves of two, 0.3 s each (no upper bound: a loaded CI machine is slower)
    s = d.stats()
    assert s["served"] == 4 and s["max_seen_running"] == 2


def test_error_rate_and_die_after(sglang: Any) -> None:
    d = sglang("--error-rate", "1.0")
    code, body = post(d.url, {"messages": MSGS})
    assert code == 500 and body["type"] == "InternalServerError"
    dying = sglang("--die-after", "2")
    assert post(dying.url, {"messages": MSGS})[0] == 200
    assert post(dying.url, {"messages": MSGS})[0] == 200
    assert dying.proc.wait(timeout=10) == 3


def test_standalone_help_needs_only_the_stdlib() -> None:
    out = subprocess.run([sys.executable, "-S", "-I", str(DOUBLE), "--help"], capture_output=True, text=True,
                         timeout=30, check=True)
    assert "--die-after" in out.stdout and "--tokens-per-s" in out.stdout


def status_of(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_answers_as_real_sglang_in_the_edge_cases(sglang: Any) -> None:
    d = sglang("--reasoning-parser", "qwen3", "--max-running", "5", "--max-running-unset")
    # empty thinking: reasoning_content null (serving_chat.py: `reasoning_text if reasoning_text else None`)
    empty = [{"role": "user", "content": f"q {sglang_double.EMPTY_THINKING}"}]
    msg = post(d.url, {"messages": empty, "max_tokens": 1000})[1]["choices"][0]["message"]
    assert msg["reasoning_content"] is None and msg["content"] == sglang_double.expected_completion(empty)[1]
    assert "</think>" in msg["content"]
    # the budget ends inside the thinking: content "" (never null), the partial thinking as reasoning
    cut = post(d.url, {"messages": MSGS, "max_tokens": 4})[1]["choices"][0]
    assert cut["finish_reason"] == "length" and cut["message"]["content"] == ""
    assert cut["message"]["reasoning_content"] == " ".join(sglang_double.completion_tokens(MSGS)[1:4])
    # started without --max-running-requests: null, the effective value in internal_states
    for path in ("/server_info", "/get_server_info"):
        info = get(d.url + path)
        assert info["max_running_requests"] is None and info["reasoning_parser"] == "qwen3"
        assert info["internal_states"][0]["effective_max_running_requests_per_dp"] == 5
    # OpenAI-style clients that put /v1 in front of the native API get FastAPI's 404
    assert status_of(d.url + "/v1/health") == 404
    plain = sglang("--no-server-info", "--max-running", "3")
    assert status_of(plain.url + "/server_info") == 404
    info = get(plain.url + "/get_server_info")
    assert info["max_running_requests"] == 3 and info["reasoning_parser"] is None


def test_abort_is_http_200_with_partial_text(sglang: Any) -> None:
    d = sglang("--reasoning-parser", "qwen3", "--abort-rate", "1.0")
    code, body = post(d.url, {"messages": MSGS, "max_tokens": 1000})
    assert code == 200 and body["choices"][0]["finish_reason"] == "abort"
    assert body["choices"][0]["matched_stop"] is None
    full = len(sglang_double.completion_tokens(MSGS))
    assert body["usage"]["completion_tokens"] == max(1, full // 2) < full
    assert d.stats()["aborted"] == 1


def test_health_is_503_while_starting() -> None:
    from genhelpers import Double

    d = Double(["--startup-s", "30"], healthy=False)
    try:
        assert status_of(d.url + "/health") == 503 and status_of(d.url + "/health_generate") == 503
    finally:
        d.stop()
    ready = Double(["--startup-s", "0.5"], healthy=True)  # waits out the 503s
    try:
        assert status_of(ready.url + "/health") == 200
    finally:
        ready.stop()
