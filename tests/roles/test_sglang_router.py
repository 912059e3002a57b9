"""The router stand-in (tests/doubles/standins/launch_router.py) answers every path as sglang-router 0.3.2
does, open and keyed (the table in its docstring, from sgl-router/src/server.rs), and is ready only with a
healthy worker; sglang_wait_ready.py, the router unit's readiness check, waits on /readiness and says why
it is not ready."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
ROUTER = ROOT / "tests" / "doubles" / "standins" / "launch_router.py"
DOUBLE = ROOT / "tests" / "doubles" / "sglang_server.py"
WAIT = ROOT / "roles" / "sglang" / "files" / "sglang_wait_ready.py"
KEY = {"Authorization": "Bearer k1"}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _call(url: str, headers: dict[str, str] | None = None, body: Any = None) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if body is not None else "GET",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    deadline = time.monotonic() + 20
    while True:
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
        except urllib.error.URLError as e:
            if not isinstance(e.reason, ConnectionRefusedError) or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _start() -> tuple[str, list[subprocess.Popen[bytes]]]:
    """(router URL, [worker, router]): a keyed SGLang double behind a router with the same key."""
    worker, router = _port(), _port()
    w = subprocess.Popen([sys.executable, str(DOUBLE), "--port", str(worker), "--api-key", "k1"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _call(f"http://127.0.0.1:{worker}/health")
    r = subprocess.Popen([sys.executable, str(ROUTER), "--port", str(router), "--api-key", "k1",
                          "--worker-urls", f"http://127.0.0.1:{worker}"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return f"http://127.0.0.1:{router}", [w, r]


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.kill()
        p.wait()


@pytest.fixture(scope="module")
def shared() -> Iterator[str]:
    url, procs = _start()
    yield url
    _stop(procs)


@pytest.fixture
def keyed() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    url, procs = _start()
    yield url, procs[0]
    _stop(procs)


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.mark.parametrize(("method", "path", "without_key", "with_key"), [
    ("GET", "/health", 200, 200),
    ("GET", "/liveness", 200, 200),
    ("GET", "/readiness", 200, 200),
    ("GET", "/health_generate", 200, 200),
    ("GET", "/get_server_info", 200, 200),  # open on the router, though keyed on the instance
    ("GET", "/get_model_info", 200, 200),
    ("GET", "/v1/models", 200, 200),
    ("POST", "/v1/chat/completions", 401, 200),
    ("POST", "/generate", 401, None),  # with the key: forwarded (the double has no /generate)
    ("GET", "/workers", 401, 200),
    ("GET", "/list_workers", 401, 200),
    ("GET", "/server_info", 404, 404),  # not a router route (sink_handler)
    ("GET", "/nope", 404, 404),
])
def test_open_and_keyed_paths_as_the_real_router(shared: str, method: str, path: str, without_key: int,
                                                 with_key: int | None) -> None:
    url = shared
    body = CHAT if method == "POST" else None
    assert _call(url + path, {}, body)[0] == without_key
    assert _call(url + path, {"Authorization": "Bearer other"}, body)[0] == without_key
    if with_key is not None:
        assert _call(url + path, KEY, body)[0] == with_key


def test_a_router_without_a_healthy_worker_is_alive_but_not_ready_and_says_which(keyed: Any) -> None:
    url, worker = keyed
    assert json.loads(_call(url + "/readiness")[1]) == {"status": "ready", "healthy_workers": 1,
                                                          "total_workers": 1}
    worker.kill()
    worker.wait()
    deadline = time.monotonic() + 10
    while _call(url + "/readiness")[0] != 503 and time.monotonic() < deadline:
        time.sleep(0.2)
    status, body = _call(url + "/readiness")
    assert status == 503
    assert json.loads(body) == {"status": "not ready", "reason": "insufficient healthy workers"}
    assert _call(url + "/health") == (200, "OK"), "the real router's /health says only that it runs"
    (listed,) = json.loads(_call(url + "/workers", KEY)[1])["workers"]
    assert listed["is_healthy"] is False and "Connection refused" in listed["last_error"], listed
    status, body = _call(url + "/v1/chat/completions", KEY, CHAT)
    assert status == 503 and json.loads(body)["error"] == "no_available_workers"
    r = subprocess.run([sys.executable, str(WAIT), "127.0.0.1", url.rsplit(":", 1)[1], "--path", "/readiness",
                        "--timeout", "1.5"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 1
    assert (f"{url}/readiness not ready after 2 s: HTTP 503 "
            '{"status": "not ready", "reason": "insufficient healthy workers"}') in r.stderr
